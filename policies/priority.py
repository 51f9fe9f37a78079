"""Priority scheduling: shortest prompt first."""

from __future__ import annotations

import numpy as np

from servegym.envs.observation import QUEUE_INDEX
from servegym.policies.base import Observation, Policy, ranks_action, register_policy
from servegym.policies.common import fcfs_count, visible_queue


@register_policy
class Priority(Policy):
    """Admit the visible waiting requests in ascending prompt length while they fit in free KV."""

    name = "priority"
    stateless = True
    source = "TWP paper baseline"
    rule = "shortest prompt first, while KV allows"

    def act(self, obs: Observation) -> np.ndarray:
        order = np.argsort(visible_queue(obs)[:, QUEUE_INDEX["num_prompt_tokens"]], kind="stable")
        return ranks_action(obs, order[: fcfs_count(obs, order)])
