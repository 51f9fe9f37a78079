"""A clairvoyant greedy packer: a point of comparison that knows every output length, not a deployable policy and
not a bound (tuned policies and FCFS can beat it: it does not plan around future arrivals or the cost of
waiting)."""

from __future__ import annotations

from typing import Any

import numpy as np

from servegym.envs.observation import QUEUE_INDEX
from servegym.policies.base import Observation, Policy, ranks_action, register_policy
from servegym.policies.common import (
    longest_feasible_prefix,
    upper_remaining_queue,
    upper_remaining_running,
    visible_queue,
)


@register_policy
class ClairvoyantGreedy(Policy):
    """CLAIRVOYANT, NOT A BOUND. Runs with true output lengths revealed (``length_mode="known"``) and packs
    greedily, shortest remaining work first, as many requests as the exact future-memory check allows. It knows
    lengths no real scheduler knows, yet it is greedy: it does not plan around future arrivals, so other
    policies can beat it."""

    name = "clairvoyant-greedy"
    stateless = True
    source = "comparison point (clairvoyant greedy packer), after the flow-control paper's hindsight comparison"
    rule = "CLAIRVOYANT: true lengths, shortest remaining first, packed to exact future-memory feasibility"
    needs_overrides = True

    def engine_overrides(self) -> dict[str, Any]:
        return {"length_mode": "known", "preemption": "lifo"}

    def act(self, obs: Observation) -> np.ndarray:
        # With true lengths revealed, the upper bounds are the exact remaining lengths.
        rows = visible_queue(obs)
        left = upper_remaining_queue(rows)
        order = np.argsort(left + 1e-6 * rows[:, QUEUE_INDEX["num_prompt_tokens"]], kind="stable")
        count = longest_feasible_prefix(obs, upper_remaining_running(obs), rows[order], left[order])
        return ranks_action(obs, order[:count])
