"""The MC benchmark (flow-control paper): FCFS admission guarded by a future-memory check."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.engine.config import LengthMode
from servegym.envs.observation import length_mode_of
from servegym.policies.base import Observation, Policy, admit_first, register_policy
from servegym.policies.common import (
    longest_feasible_prefix,
    upper_remaining_queue,
    upper_remaining_running,
    visible_queue,
)
from servegym.policies.params import PolicyParams, non_negative_number, param


@dataclass(frozen=True)
class MemoryConstrainedParams(PolicyParams):
    unknown_output_bound: float = param(
        0.0, "tokens MC assumes an output of unknown length may reach: the paper's MC takes the workload's longest "
        "possible output (60 in its synthetic classes); 0 = the upper end of the interval the env shows, which "
        "with unknown lengths is the engine's max_tokens (the experiments set it to the workload's longest output)",
        non_negative_number)


@register_policy
class MemoryConstrained(Policy):
    """Admit in arrival order while the KV footprint stays within M at every future completion time."""

    name = "mc"
    stateless = True
    source = "Dong & Cao (flow-control paper), baseline: MC benchmark"
    rule = ("FCFS, admitting only if projected memory stays within M at every future completion (upper bounds; an "
            "unknown output at the workload's longest possible)")
    uses_output_lengths = True
    Params = MemoryConstrainedParams

    def act(self, obs: Observation) -> np.ndarray:
        bound = self.params.unknown_output_bound if length_mode_of(obs) == LengthMode.UNKNOWN else 0.0
        rows = visible_queue(obs)
        count = longest_feasible_prefix(obs, upper_remaining_running(obs, bound), rows,
                                        upper_remaining_queue(rows, bound))
        return admit_first(obs, count)
