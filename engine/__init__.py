"""The gym-free simulator core: one container's iteration (request lifecycle, paged KV accounting, chunked prefill,
preemption), its config and its episode log. The pool of containers over it is :mod:`servegym.pool`."""

from servegym.engine.compiled import CompiledEngine, compiled_available, engine_class
from servegym.engine.config import EngineConfig, LengthMode, PreemptionRule, Recompute
from servegym.engine.engine import Engine
from servegym.engine.log import STEP_FIELDS, STEP_INDEX, EpisodeLog, RejectReason, State, StepRow
from servegym.engine.table import RUNNING_OBS_COLUMNS, Col, StepOutcome

__all__ = [
    "RUNNING_OBS_COLUMNS", "STEP_FIELDS", "STEP_INDEX", "Col", "CompiledEngine", "Engine", "EngineConfig",
    "EpisodeLog", "LengthMode", "PreemptionRule", "Recompute", "RejectReason", "State", "StepOutcome", "StepRow",
    "compiled_available", "engine_class",
]


def __getattr__(name: str) -> object:
    """Deprecated aliases of the pool's names, imported from here before :mod:`servegym.pool` held them."""
    if name not in ("Cluster", "ClusterStep", "PoolConfig", "Router", "length_intervals"):
        raise AttributeError(f"module 'servegym.engine' has no attribute {name!r}")
    import warnings

    from servegym import pool

    warnings.warn(f"servegym.engine.{name} moved to servegym.pool.{name}", DeprecationWarning, stacklevel=2)
    return getattr(pool, name)
