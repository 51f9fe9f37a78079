"""vLLM V1-style scheduling: one token budget, running requests first, FCFS admission with chunked prefill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.engine.kv import num_blocks
from servegym.envs.observation import ENGINE_INDEX, QUEUE_INDEX, RUNNING_INDEX
from servegym.policies.base import Observation, Policy, admit_first, register_policy
from servegym.policies.common import cached_tokens, engine_values, free_blocks, free_slots, visible_queue
from servegym.policies.params import PolicyParams, param, positive_int

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class VLLMParams(PolicyParams):
    max_num_batched_tokens: int = param(2048, "token budget per step", positive_int)
    max_num_seqs: int = param(128, "most running requests", positive_int)

    def validate(self) -> None:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")


_LEFT, _STRIDE = RUNNING_INDEX["num_prefill_left"], len(RUNNING_INDEX)
_PROMPT, _GENERATED = QUEUE_INDEX["num_prompt_tokens"], QUEUE_INDEX["num_generated"]
_RUNNING, _CHUNK, _BLOCK, _PREEMPTIONS = (ENGINE_INDEX[name] for name in (
    "num_running", "prefill_chunk_tokens", "kv_block_size", "last_num_preemptions"))


def budget_after_running(obs: Observation, budget: int, engine: list[float] | None = None) -> int:
    """Tokens left in the step budget after every decode and every ongoing prefill chunk (``engine``:
    :func:`~servegym.policies.common.engine_values`, if read)."""
    engine = engine_values(obs) if engine is None else engine
    num_running = int(engine[_RUNNING])
    left = obs["running"][_LEFT : num_running * _STRIDE : _STRIDE]  # the running rows' prefill left
    prefilling = left[left > 0]
    chunks = int(np.minimum(prefilling, engine[_CHUNK]).sum()) if prefilling.size else 0
    return max(0, budget - (num_running - prefilling.size) - chunks)


def admit_within_budget(obs: Observation, budget_left: int, engine: list[float] | None = None) -> int:
    """FCFS admissions while step tokens remain and each request's first chunk of uncached tokens gets its KV
    blocks (``engine``: :func:`~servegym.policies.common.engine_values`, if read)."""
    engine = engine_values(obs) if engine is None else engine
    rows = visible_queue(obs, engine)[: free_slots(obs, engine)]
    block, chunk = engine[_BLOCK], engine[_CHUNK]
    blocks, count = free_blocks(obs, engine), 0
    # With prefix caching, the cached prompt tokens are computed already: only the rest is scheduled (vLLM's
    # num_new_tokens) and takes new blocks.
    hits = cached_tokens(obs, rows.shape[0]).tolist() if "queue_prefix" in obs else [0] * rows.shape[0]
    for prompt, generated, hit in zip(rows[:, _PROMPT].tolist(), rows[:, _GENERATED].tolist(), hits,
                                      strict=True):
        target = prompt + generated - hit
        first = min(chunk, target, budget_left)
        need = num_blocks(first + (first == target), block)
        if budget_left <= 0 or need > blocks:
            break
        budget_left -= first
        blocks -= need
        count += 1
    return count


@register_policy
class VLLMV1(Policy):
    """Serve running requests first; admit FCFS while the token budget and KV blocks last; no admissions in a
    step after a preemption; preempted requests recompute from the queue front (LIFO victims)."""

    name = "vllm"
    stateless = True
    source = "vLLM V1 scheduler (Kwon et al., SOSP 2023; vLLM v1 engine)"
    rule = "token budget and max_num_seqs; running first; FCFS chunked admission; none in a step that preempted"
    Params = VLLMParams

    @staticmethod
    def search_space(trial: optuna.Trial) -> dict[str, Any]:
        return {"max_num_batched_tokens": trial.suggest_int("max_num_batched_tokens", 128, 8192, log=True)}

    def engine_overrides(self) -> dict[str, Any]:
        p = self.params
        return {"max_num_batched_tokens": p.max_num_batched_tokens, "max_num_seqs": p.max_num_seqs,
                "prefill_chunk_tokens": p.max_num_batched_tokens, "preemption": "lifo"}

    def act(self, obs: Observation) -> np.ndarray:
        engine = engine_values(obs)  # read once for the three rules below
        if engine[_PREEMPTIONS] > 0:
            return admit_first(obs, 0)
        budget_left = budget_after_running(obs, self.params.max_num_batched_tokens, engine)
        return admit_first(obs, admit_within_budget(obs, budget_left, engine))
