"""Admission arithmetic shared by the hand-coded policies: free KV, prompt blocks, future-memory checks."""

from __future__ import annotations

import math

import numpy as np

from servegym.engine.kv import num_blocks
from servegym.envs.observation import (
    ENGINE_INDEX,
    QUEUE_INDEX,
    RUNNING_INDEX,
    length_mode_of,
    queue_prefix_matrix,
    running_matrix,
)
from servegym.policies.base import Observation, engine_feature, output_estimate
from servegym.policies.kernels import feasible_count, fitting_count, score_admit, upper_bound_count

_PROMPT, _GENERATED, _WIDTH = QUEUE_INDEX["num_prompt_tokens"], QUEUE_INDEX["num_generated"], len(QUEUE_INDEX)
_STRIDE = len(RUNNING_INDEX)
_RUNNING, _WAITING, _BLOCK, _FREE, _CAPACITY = (ENGINE_INDEX[name] for name in (
    "num_running", "num_waiting", "kv_block_size", "kv_free_frac", "kv_capacity_tokens"))


def engine_values(obs: Observation) -> list[float]:
    """``obs["engine"]`` as plain floats, read once (index it with ``ENGINE_INDEX``): the per-step path of the
    policies that read several features."""
    return obs["engine"].tolist()


def visible_count(obs: Observation, engine: list[float] | None = None) -> int:
    """How many waiting requests the queue window shows; ``engine``: :func:`engine_values`, if read."""
    engine = engine_values(obs) if engine is None else engine
    return min(int(engine[_WAITING]), obs["queue"].shape[0] // _WIDTH)


def visible_queue(obs: Observation, engine: list[float] | None = None) -> np.ndarray:
    """The rows of the visible waiting requests (queue head first); ``engine``: :func:`engine_values`, if read."""
    return obs["queue"][: visible_count(obs, engine) * _WIDTH].reshape(-1, _WIDTH)


def cached_tokens(obs: Observation, count: int, host: bool = True) -> np.ndarray:
    """Prompt tokens each of the first ``count`` visible waiting requests would find cached (GPU, plus the host
    tier unless ``host=False``): zeros without prefix caching."""
    cached = queue_prefix_matrix(obs)[:count]
    return (cached[:, 0] + cached[:, 1] if host else cached[:, 0]).astype(np.float64)


def running_rows(obs: Observation) -> np.ndarray:
    return running_matrix(obs)[: int(engine_feature(obs, "num_running"))]


def free_slots(obs: Observation, engine: list[float] | None = None) -> int:
    """How many more requests the engine can run (``max_num_seqs`` minus the batch)."""
    engine = engine_values(obs) if engine is None else engine
    return max(0, obs["running"].shape[0] // _STRIDE - int(engine[_RUNNING]))


def free_blocks(obs: Observation, engine: list[float] | None = None) -> int:
    engine = engine_values(obs) if engine is None else engine
    return round(engine[_FREE] * engine[_CAPACITY] / engine[_BLOCK])


def total_blocks(obs: Observation) -> int:
    return round(engine_feature(obs, "kv_capacity_tokens") / engine_feature(obs, "kv_block_size"))


def remaining_running(obs: Observation, unknown_prior: float | None) -> np.ndarray:
    """Estimated output tokens left for each running request (at least 1), see :func:`output_estimate`."""
    run = running_rows(obs)
    estimate = output_estimate(run[:, RUNNING_INDEX["output_lo"]], run[:, RUNNING_INDEX["output_hi"]],
                               length_mode_of(obs), unknown_prior)
    return np.maximum(estimate - run[:, RUNNING_INDEX["num_generated"]], 1.0)


def remaining_queued(obs: Observation, rows: np.ndarray, unknown_prior: float | None) -> np.ndarray:
    """Estimated output tokens still to generate for each waiting request in ``rows`` (at least 1)."""
    estimate = output_estimate(rows[:, QUEUE_INDEX["output_lo"]], rows[:, QUEUE_INDEX["output_hi"]],
                               length_mode_of(obs), unknown_prior)
    return np.maximum(estimate - rows[:, QUEUE_INDEX["num_generated"]], 1.0)


def upper_remaining_running(obs: Observation, bound: float = 0.0) -> np.ndarray:
    """Remaining output tokens of running requests at their upper bound (exact when lengths are known); a positive
    ``bound`` replaces the observed upper end (a rule's own assumption for unknown lengths)."""
    run = running_rows(obs)
    hi = run[:, RUNNING_INDEX["output_hi"]] if bound <= 0 else bound
    return np.maximum(hi - run[:, RUNNING_INDEX["num_generated"]], 1.0)


def upper_remaining_queue(rows: np.ndarray, bound: float = 0.0) -> np.ndarray:
    """Remaining output tokens of waiting requests ``rows`` at their upper bound (or at ``bound``, when positive)."""
    hi = rows[:, QUEUE_INDEX["output_hi"]] if bound <= 0 else bound
    return np.maximum(hi - rows[:, QUEUE_INDEX["num_generated"]], 1.0)


def admission_blocks(obs: Observation, rows: np.ndarray) -> np.ndarray:
    """KV blocks each waiting request needs on admission: its prompt, tokens to recompute, first token."""
    block = engine_feature(obs, "kv_block_size")
    return num_blocks(rows[:, QUEUE_INDEX["num_prompt_tokens"]] + rows[:, QUEUE_INDEX["num_generated"]] + 1, block)


def prefix_that_fits(need: np.ndarray, budget: float) -> int:
    """The longest prefix of ``need`` (in order) whose sum stays within ``budget``."""
    return int(np.searchsorted(np.cumsum(need), budget, side="right"))


def fcfs_count(obs: Observation, order: np.ndarray | None = None, budget_blocks: float | None = None) -> int:
    """How many visible requests (in ``order``, default queue order) fit in free KV blocks (or ``budget_blocks``)
    and slots: ``prefix_that_fits(admission_blocks(obs, rows), budget)`` capped at the free slots, less the blocks
    of prompt tokens cached in GPU memory (whole blocks: a cached prefix is whole units);
    :func:`~servegym.policies.kernels.fitting_count` counts it."""
    engine = engine_values(obs)
    visible = visible_count(obs, engine)
    if not visible:
        return 0
    order = np.arange(visible, dtype=np.int64) if order is None else _slots(order)
    budget = free_blocks(obs, engine) if budget_blocks is None else budget_blocks
    return fitting_count(_floats(obs["queue"]), order, _gpu_hits(obs, visible, order), int(engine[_BLOCK]), budget,
                         free_slots(obs, engine))


def _floats(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32)


def _doubles(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float64)


def _slots(order: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(order, dtype=np.int64)


def _gpu_hits(obs: Observation, visible: int, order: np.ndarray) -> np.ndarray:
    """Prompt tokens GPU-cached for each request in ``order`` (zeros without prefix caching)."""
    if "queue_prefix" not in obs:
        return np.zeros(order.shape[0])
    return _doubles(cached_tokens(obs, visible, host=False)[order])


def longest_feasible_prefix(obs: Observation, running_remaining: np.ndarray, rows: np.ndarray,
                            remaining: np.ndarray, capacity_scale: float = 1.0) -> int:
    """The longest prefix of ``rows`` (in order, at most the free slots) that keeps future memory feasible: the
    running requests plus the prefix stay within ``capacity_scale`` x the KV cache at every future step,
    counted in tokens with one block of rounding slack per request (blocks hold whole tokens).

    Request ``j`` holds ``current[j] + t`` tokens ``t`` steps from now until it finishes after its remaining
    tokens (``running_remaining``, ``remaining``: upper bounds, or estimates). Between completions memory only
    grows, so a set's peak sits at one of its completion times ``t``, where it is the sum over the requests
    still running of ``current + t``; at any other ``t`` that sum is no larger than at the set's next
    completion, so every prefix's peak is the largest such sum over the completion times of *all* requests
    (running and every candidate), and adding requests never lowers it, so the answer is the first prefix that
    fails (:func:`~servegym.policies.kernels.feasible_count` runs the loop).
    """
    limit = min(rows.shape[0], free_slots(obs))
    if limit == 0:
        return 0
    run = running_rows(obs)
    run_current = run[:, RUNNING_INDEX["num_prompt_tokens"]] + run[:, RUNNING_INDEX["num_generated"]]
    current = rows[:limit, _PROMPT] + rows[:limit, _GENERATED]
    scratch = np.empty((2, run.shape[0] + limit))
    return feasible_count(_doubles(run_current), _doubles(running_remaining), _doubles(current),
                          _doubles(remaining[:limit]), scratch[0], scratch[1],
                          engine_feature(obs, "kv_block_size") - 1,
                          capacity_scale * engine_feature(obs, "kv_capacity_tokens"))


def admit_by_score(obs: Observation, scores: np.ndarray, memory_target: float) -> np.ndarray:
    """Admit the visible queue highest ``scores`` first (one per visible slot; ties keep queue order): the
    longest prefix in that order that fits now (free blocks and slots) and keeps the projected peak KV use, at
    the upper-bound output lengths, within ``memory_target`` x the cache. The rule of the ``score`` action mode
    and of the parametric scorer: a stable ``argsort`` of ``-scores`` cut at :func:`upper_bound_prefix`, in one
    compiled pass (:func:`~servegym.policies.kernels.score_admit`)."""
    engine = engine_values(obs)
    visible = visible_count(obs, engine)
    scores = np.ascontiguousarray(scores, dtype=np.float64).reshape(-1)
    if scores.size < visible:
        raise ValueError(f"{scores.size} scores for {visible} visible waiting requests")
    if not (math.isfinite(memory_target) and memory_target > 0):
        raise ValueError(_score_error(memory_target))
    action = np.zeros(obs["queue"].shape[0] // _WIDTH, dtype=np.int64)
    if not visible:
        return action
    num_run = int(engine[_RUNNING])
    hits = cached_tokens(obs, visible, host=False) if "queue_prefix" in obs else np.zeros(visible)
    if score_admit(_floats(obs["queue"]), _floats(obs["running"]), hits, scores, visible, num_run, int(engine[_BLOCK]),
                   free_blocks(obs, engine), free_slots(obs, engine), memory_target * engine[_CAPACITY],
                   np.empty(visible, dtype=np.int64), action, np.empty((8, num_run + visible))) < 0:
        raise ValueError(_score_error(memory_target))
    return action


def _score_error(memory_target: float) -> str:
    """:func:`admit_by_score`'s message for a score or memory target it cannot use (built only when raised)."""
    return f"scores must be finite and memory_target finite and > 0, got {memory_target!r}"


def upper_bound_prefix(obs: Observation, order: np.ndarray, memory_target: float,
                       engine: list[float] | None = None) -> int:
    """How many visible requests, in ``order`` (slots), to admit: the longest prefix that fits now
    (:func:`fcfs_count`) and keeps the projected peak KV use, at the upper-bound output lengths, within
    ``memory_target`` x the cache (:func:`longest_feasible_prefix`), in one compiled pass
    (:func:`~servegym.policies.kernels.upper_bound_count`)."""
    engine = engine_values(obs) if engine is None else engine
    order = _slots(order)
    scratch = np.empty((5, int(engine[_RUNNING]) + order.shape[0]))
    return upper_bound_count(_floats(obs["queue"]), order, _gpu_hits(obs, visible_count(obs, engine), order),
                             int(engine[_BLOCK]), free_blocks(obs, engine), free_slots(obs, engine),
                             _floats(obs["running"]), _doubles(upper_remaining_running(obs)),
                             _doubles(upper_remaining_queue(visible_queue(obs, engine))),
                             memory_target * engine[_CAPACITY], scratch)
