"""The serverless pool over the engine: one workload, its arrivals routed to containers that go cold after a
keep-alive and pay a cold start to load, and the pool's event clock. One warm container (the default) is exactly
one engine fed by the workload."""

from servegym.pool.cluster import Cluster, ClusterStep, PoolConfig, length_intervals
from servegym.pool.routing import Router

__all__ = ["Cluster", "ClusterStep", "PoolConfig", "Router", "length_intervals"]
