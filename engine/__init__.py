"""The gym-free simulator core: request lifecycle, paged KV accounting, chunked prefill, preemption."""

from servegym.engine.cluster import Cluster, ClusterStep, PoolConfig, length_intervals
from servegym.engine.config import EngineConfig, LengthMode, PreemptionRule
from servegym.engine.engine import RUNNING_OBS_COLUMNS, Col, Engine, Plan, StepOutcome
from servegym.engine.log import STEP_FIELDS, STEP_INDEX, EpisodeLog, RejectReason, State, StepRow
from servegym.engine.routing import Router

__all__ = [
    "RUNNING_OBS_COLUMNS",
    "STEP_FIELDS",
    "STEP_INDEX",
    "Cluster",
    "ClusterStep",
    "Col",
    "Engine",
    "EngineConfig",
    "EpisodeLog",
    "LengthMode",
    "Plan",
    "PoolConfig",
    "PreemptionRule",
    "RejectReason",
    "Router",
    "State",
    "StepOutcome",
    "StepRow",
    "length_intervals",
]
