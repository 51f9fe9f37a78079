"""A clairvoyant reference point, not a deployable policy."""

from __future__ import annotations

from typing import Any

import numpy as np

from servegym.envs.observation import QUEUE_INDEX, RUNNING_INDEX
from servegym.policies.base import Observation, Policy, ranks_action, register_policy
from servegym.policies.common import longest_feasible_prefix, running_rows, visible_queue


@register_policy
class Hindsight(Policy):
    """REFERENCE ONLY. Runs with true output lengths revealed (``length_mode="known"``) and packs greedily,
    shortest remaining work first, as many requests as the exact future-memory check allows. It knows lengths
    no real scheduler knows; it does not plan around future arrivals."""

    name = "hindsight"
    source = "reference point (clairvoyant), after the flow-control paper's hindsight comparison"
    rule = "REFERENCE: true lengths, shortest remaining first, packed to exact future-memory feasibility"

    def engine_overrides(self) -> dict[str, Any]:
        return {"length_mode": "known", "preemption": "lifo"}

    def act(self, obs: Observation) -> np.ndarray:
        run = running_rows(obs)
        running_left = np.maximum(run[:, RUNNING_INDEX["output_hi"]] - run[:, RUNNING_INDEX["generated"]], 1.0)
        rows = visible_queue(obs)
        left = np.maximum(rows[:, QUEUE_INDEX["output_hi"]] - rows[:, QUEUE_INDEX["generated"]], 1.0)
        order = np.argsort(left + 1e-6 * rows[:, QUEUE_INDEX["prompt_tokens"]], kind="stable")
        count = longest_feasible_prefix(obs, running_left, rows[order], left[order])
        return ranks_action(obs, order[:count])
