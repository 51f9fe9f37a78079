"""DynamicBatch: a batch-size cap that holds while ITL is above a static target."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servegym.policies.base import Observation, Policy, admit_first, engine_feature, register_policy
from servegym.policies.common import fcfs_count


@dataclass(frozen=True)
class DynamicBatchParams:
    itl_target_s: float = field(default=0.1, metadata={"help": "static ITL target (s); above it the batch is capped"})
    max_batch: int = field(default=64, metadata={"help": "batch cap while ITL is within target"})

    def __post_init__(self) -> None:
        if not (math.isfinite(self.itl_target_s) and self.itl_target_s > 0):
            raise ValueError(f"itl_target_s must be a finite number > 0, got {self.itl_target_s!r}")
        if not (isinstance(self.max_batch, int) and self.max_batch > 0):
            raise ValueError(f"max_batch must be a positive int, got {self.max_batch!r}")


@register_policy
class DynamicBatch(Policy):
    """FCFS up to ``max_batch``; while smoothed ITL exceeds the target, the batch may not grow."""

    name = "dynamic-batch"
    source = "TWP paper baseline (batch-level feedback, no token-level signal)"
    rule = "caps the batch size while ITL exceeds a static target"

    def __init__(self, **params: Any) -> None:
        self.params = DynamicBatchParams(**params)

    @staticmethod
    def search_space(trial) -> dict[str, Any]:
        return {"itl_target_s": trial.suggest_float("itl_target_s", 0.02, 2.0, log=True)}

    def act(self, obs: Observation) -> np.ndarray:
        if engine_feature(obs, "itl_smoothed_s") > self.params.itl_target_s:
            return admit_first(obs, 0)
        room = max(0, self.params.max_batch - int(engine_feature(obs, "num_running")))
        return admit_first(obs, min(room, fcfs_count(obs)))
