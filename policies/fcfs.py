"""First-come, first-served admission, bounded only by free KV memory."""

from __future__ import annotations

import numpy as np

from servegym.policies.base import Observation, Policy, admit_first, register_policy
from servegym.policies.common import fcfs_count


@register_policy
class FCFS(Policy):
    """Admit waiting requests in arrival order while their prompts fit in free KV blocks."""

    name = "fcfs"
    stateless = True
    source = "TWP paper baseline; vLLM's default FCFS scheduler"
    rule = "arrival order, no concurrency bound beyond KV"

    def act(self, obs: Observation) -> np.ndarray:
        return admit_first(obs, fcfs_count(obs))
