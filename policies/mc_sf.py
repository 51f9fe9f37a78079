"""MC-SF (Jaillet et al. 2025): memory-constrained shortest-first admission."""

from __future__ import annotations

import numpy as np

from servegym.envs.observation import QUEUE_INDEX, length_mode_of
from servegym.policies.base import Observation, Policy, output_estimate, ranks_action, register_policy
from servegym.policies.common import (
    longest_feasible_prefix,
    upper_remaining_queue,
    upper_remaining_running,
    visible_queue,
)


@register_policy
class MCShortestFirst(Policy):
    """Sort the queue by predicted output length; admit the longest prefix that keeps future memory within M."""

    name = "mc-sf"
    source = ("Jaillet, Jiang, Mellou, Molinaro, Podimata, Zhou: "
              "Online Scheduling for LLM Inference with KV Cache Constraints (2025)")
    rule = "queue sorted by predicted output ascending; admit the longest prefix feasible at every future completion"
    uses_output_lengths = True

    def act(self, obs: Observation) -> np.ndarray:
        rows = visible_queue(obs)
        mode = length_mode_of(obs)
        predicted = output_estimate(rows[:, QUEUE_INDEX["output_lo"]], rows[:, QUEUE_INDEX["output_hi"]], mode, None)
        order = np.argsort(predicted, kind="stable")
        rows = rows[order]
        count = longest_feasible_prefix(obs, upper_remaining_running(obs), rows, upper_remaining_queue(rows))
        return ranks_action(obs, order[:count])
