"""DynamicBatch: a batch-size cap that holds while ITL is above a static target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.policies.base import Observation, Policy, admit_first, engine_feature, register_policy
from servegym.policies.common import fcfs_count
from servegym.policies.params import PolicyParams, param, positive_int, positive_number

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class DynamicBatchParams(PolicyParams):
    itl_target_s: float = param(0.1, "static ITL target (s); above it the batch is capped", positive_number)
    max_batch: int = param(64, "batch cap while ITL is within target", positive_int)

@register_policy
class DynamicBatch(Policy):
    """FCFS up to ``max_batch``; while smoothed ITL exceeds the target, the batch may not grow."""

    name = "dynamic-batch"
    stateless = True
    source = "TWP paper baseline (batch-level feedback, no token-level signal)"
    rule = "caps the batch size while ITL exceeds a static target"
    Params = DynamicBatchParams


    @staticmethod
    def search_space(trial: optuna.Trial) -> dict[str, Any]:
        return {"itl_target_s": trial.suggest_float("itl_target_s", 0.02, 2.0, log=True)}

    def act(self, obs: Observation) -> np.ndarray:
        if engine_feature(obs, "itl_smoothed_s") > self.params.itl_target_s:
            return admit_first(obs, 0)
        room = max(0, self.params.max_batch - int(engine_feature(obs, "num_running")))
        return admit_first(obs, min(room, fcfs_count(obs)))
