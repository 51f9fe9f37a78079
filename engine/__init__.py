"""The gym-free simulator core: request lifecycle, paged KV accounting, chunked prefill, preemption."""

from servegym.engine.config import EngineConfig, LengthMode, PreemptionRule
from servegym.engine.engine import RUNNING_OBS_COLUMNS, Engine, StepOutcome
from servegym.engine.log import STEP_FIELDS, EpisodeLog, RejectReason, State

__all__ = [
    "RUNNING_OBS_COLUMNS",
    "STEP_FIELDS",
    "Engine",
    "EngineConfig",
    "EpisodeLog",
    "LengthMode",
    "PreemptionRule",
    "RejectReason",
    "State",
    "StepOutcome",
]
