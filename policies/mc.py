"""The MC benchmark (flow-control paper): FCFS admission guarded by a future-memory check."""

from __future__ import annotations

import numpy as np

from servegym.policies.base import Observation, Policy, admit_first, register_policy
from servegym.policies.common import (
    longest_feasible_prefix,
    upper_remaining_queue,
    upper_remaining_running,
    visible_queue,
)


@register_policy
class MemoryConstrained(Policy):
    """Admit in arrival order while the KV footprint stays within M at every future completion time."""

    name = "mc"
    stateless = True
    source = "Dong & Cao (flow-control paper), baseline: MC benchmark"
    rule = "FCFS, admitting only if projected memory stays within M at every future completion (upper bounds)"
    uses_output_lengths = True

    def act(self, obs: Observation) -> np.ndarray:
        rows = visible_queue(obs)
        count = longest_feasible_prefix(obs, upper_remaining_running(obs), rows, upper_remaining_queue(rows))
        return admit_first(obs, count)
