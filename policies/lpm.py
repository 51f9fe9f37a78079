"""Longest prefix match first (SGLang): admit the requests whose prompts are most cached."""

from __future__ import annotations

import numpy as np

from servegym.policies.base import Observation, Policy, ranks_action, register_policy
from servegym.policies.common import cached_tokens, fcfs_count, visible_queue


@register_policy
class LongestPrefixMatch(Policy):
    """Order the visible queue by cached prompt tokens (GPU and host), most first, arrival order among equals;
    admit in that order while requests fit in free KV blocks and slots. Without prefix caching nothing is cached
    and it is FCFS."""

    name = "lpm"
    stateless = True
    source = "SGLang's longest-prefix-match schedule over its radix cache (Zheng et al., NeurIPS 2024)"
    rule = "most cached prompt tokens first, arrival order among equals; admit while KV blocks and slots last"

    def act(self, obs: Observation) -> np.ndarray:
        rows = visible_queue(obs)
        order = np.argsort(-cached_tokens(obs, rows.shape[0]), kind="stable")
        return ranks_action(obs, order[: fcfs_count(obs, order)])
