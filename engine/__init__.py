"""The gym-free simulator core: request lifecycle, paged KV accounting, chunked prefill, preemption."""

from servegym.engine.cluster import Cluster, ClusterStep, PoolConfig, length_intervals
from servegym.engine.config import EngineConfig, LengthMode, PreemptionRule
from servegym.engine.engine import RUNNING_OBS_COLUMNS, Engine, StepOutcome
from servegym.engine.log import STEP_FIELDS, EpisodeLog, RejectReason, State
from servegym.engine.routing import Router

__all__ = [
    "RUNNING_OBS_COLUMNS",
    "STEP_FIELDS",
    "Cluster",
    "ClusterStep",
    "Engine",
    "EngineConfig",
    "EpisodeLog",
    "LengthMode",
    "PoolConfig",
    "PreemptionRule",
    "RejectReason",
    "Router",
    "State",
    "StepOutcome",
    "length_intervals",
]
