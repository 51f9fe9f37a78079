"""Optuna tuning of the policies' declared search spaces (extra ``tune``)."""

from servegym.tuning.objectives import OBJECTIVES, Objective, get_objective
from servegym.tuning.stopping import TuningInterrupted
from servegym.tuning.storage import TuningError, fail_stale_trials, make_storage
from servegym.tuning.study import (
    TUNING_SEED_BASE,
    TuneConfig,
    best_params,
    finished_trials,
    fresh_seed,
    load_study,
    read_params,
    tune,
    write_params,
)

__all__ = [
    "OBJECTIVES",
    "TUNING_SEED_BASE",
    "Objective",
    "TuneConfig",
    "TuningError",
    "TuningInterrupted",
    "best_params",
    "fail_stale_trials",
    "finished_trials",
    "fresh_seed",
    "get_objective",
    "load_study",
    "make_storage",
    "read_params",
    "tune",
    "write_params",
]
