"""The MC benchmark (flow-control paper): FCFS admission guarded by a future-memory check."""

from __future__ import annotations

import numpy as np

from servegym.envs.observation import QUEUE_INDEX, RUNNING_INDEX
from servegym.policies.base import Observation, Policy, admit_first, register_policy
from servegym.policies.common import longest_feasible_prefix, running_rows, visible_queue


def upper_remaining_running(obs: Observation) -> np.ndarray:
    """Remaining output tokens of running requests, at their upper bound (exact when lengths are known)."""
    run = running_rows(obs)
    return np.maximum(run[:, RUNNING_INDEX["output_hi"]] - run[:, RUNNING_INDEX["generated"]], 1.0)


def upper_remaining_queue(rows: np.ndarray) -> np.ndarray:
    return np.maximum(rows[:, QUEUE_INDEX["output_hi"]] - rows[:, QUEUE_INDEX["generated"]], 1.0)


@register_policy
class MemoryConstrained(Policy):
    """Admit in arrival order while the KV footprint stays within M at every future completion time."""

    name = "mc"
    source = "Dong & Cao (flow-control paper), baseline: MC benchmark"
    rule = "FCFS, admitting only if projected memory stays within M at every future completion (upper bounds)"

    def act(self, obs: Observation) -> np.ndarray:
        rows = visible_queue(obs)
        count = longest_feasible_prefix(obs, upper_remaining_running(obs), rows, upper_remaining_queue(rows))
        return admit_first(obs, count)
