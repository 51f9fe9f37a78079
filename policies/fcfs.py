"""First-come, first-served admission, bounded only by free KV memory."""

from __future__ import annotations

import numpy as np

from servegym.envs.observation import QUEUE_INDEX, RUNNING_INDEX, queue_matrix
from servegym.policies.base import Observation, Policy, admit_first, engine_feature, register_policy

_PROMPT, _GENERATED = QUEUE_INDEX["prompt_tokens"], QUEUE_INDEX["generated"]


@register_policy
class FCFS(Policy):
    """Admit waiting requests in arrival order while their prompts fit in free KV memory."""

    name = "fcfs"
    source = "TWP paper baseline; vLLM's default FCFS scheduler"
    rule = "arrival order, no concurrency bound beyond KV"

    def act(self, obs: Observation) -> np.ndarray:
        queue = queue_matrix(obs)
        block = engine_feature(obs, "kv_block_size")
        free_blocks = round(engine_feature(obs, "kv_free_frac") * engine_feature(obs, "kv_capacity_tokens") / block)
        free_slots = obs["running"].shape[0] // len(RUNNING_INDEX) - int(engine_feature(obs, "batch_size"))
        # Each admitted request needs blocks for its prompt (plus tokens to recompute) and its first token.
        need = np.cumsum(np.ceil((queue[:, _PROMPT] + queue[:, _GENERATED] + 1) / block))
        depth = min(int(engine_feature(obs, "queue_depth")), queue.shape[0], max(free_slots, 0))
        fits = int(np.searchsorted(need[:depth], free_blocks, side="right"))
        return admit_first(obs, fits)
