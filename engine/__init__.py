"""The gym-free simulator core: request lifecycle, paged KV accounting, chunked prefill, preemption."""

from servegym.engine.cluster import Cluster, ClusterStep, PoolConfig, length_intervals
from servegym.engine.compiled import CompiledEngine, compiled_available, engine_class
from servegym.engine.config import EngineConfig, LengthMode, PreemptionRule, Recompute
from servegym.engine.engine import Engine
from servegym.engine.log import STEP_FIELDS, STEP_INDEX, EpisodeLog, RejectReason, State, StepRow
from servegym.engine.routing import Router
from servegym.engine.table import RUNNING_OBS_COLUMNS, Col, StepOutcome

__all__ = [
    "RUNNING_OBS_COLUMNS",
    "STEP_FIELDS",
    "STEP_INDEX",
    "Cluster",
    "ClusterStep",
    "Col",
    "CompiledEngine",
    "Engine",
    "EngineConfig",
    "EpisodeLog",
    "LengthMode",
    "PoolConfig",
    "PreemptionRule",
    "Recompute",
    "RejectReason",
    "Router",
    "State",
    "StepOutcome",
    "StepRow",
    "compiled_available",
    "engine_class",
    "length_intervals",
]
