"""Optuna tuning of the policies' declared search spaces (extra ``tune``)."""

from servegym.tuning.objectives import OBJECTIVES, Objective, get_objective
from servegym.tuning.study import (
    TUNING_SEED_BASE,
    TuneConfig,
    best_params,
    load_study,
    make_storage,
    read_params,
    tune,
    write_params,
)

__all__ = [
    "OBJECTIVES",
    "TUNING_SEED_BASE",
    "Objective",
    "TuneConfig",
    "best_params",
    "get_objective",
    "load_study",
    "make_storage",
    "read_params",
    "tune",
    "write_params",
]
