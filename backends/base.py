"""The interface between the engine and whatever executes an iteration."""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


class StepBatch(NamedTuple):
    """What one engine iteration runs: decode rows and prefill chunks, all in one forward pass.

    Arrays are read-only views owned by the engine; a backend must not keep them past ``execute``.
    """

    decode_ids: np.ndarray
    """Request ids that each decode one token."""
    decode_context: np.ndarray
    """KV tokens each decoding request holds before this iteration (its attention context)."""
    prefill_ids: np.ndarray
    """Request ids that ingest a prompt chunk."""
    prefill_start: np.ndarray
    """Prompt tokens each prefill request had ingested before this chunk."""
    prefill_len: np.ndarray
    """Tokens in each chunk."""
    prefill_target: np.ndarray
    """Tokens each prefill request ingests in all (prompt plus tokens to recompute); a chunk that reaches it
    completes the prefill and samples the request's next token."""


EMPTY = np.zeros(0, dtype=np.int64)
EMPTY.flags.writeable = False


class BatchTotals(NamedTuple):
    """What a latency model needs of a :class:`StepBatch`: its sizes and sums, no per-request arrays."""

    num_decodes: int
    decode_context: float
    """KV tokens the decodes read (the sum of ``decode_context``)."""
    num_prefills: int
    prefill_tokens: float
    """Prompt tokens the chunks ingest (the sum of ``prefill_len``)."""
    prefill_pairs: float
    """(query, key) pairs of the causal chunks: token j of a chunk sees ``start + j + 1`` tokens."""
    num_completes: int
    """Chunks that complete their prefill (and so sample a first token)."""


def batch_totals(batch: StepBatch) -> BatchTotals:
    """The sizes and sums of ``batch``. Every term is an integer or a half-integer far below 2**53, so the sums
    are exact in any order (a compiled engine that adds them row by row gets the same floats)."""
    decodes, prefills = batch.decode_ids.size, batch.prefill_ids.size
    context = float(batch.decode_context.sum()) if decodes else 0.0
    if not prefills:
        return BatchTotals(decodes, context, 0, 0.0, 0.0, 0)
    length, start = batch.prefill_len, batch.prefill_start
    completes = int(np.count_nonzero(start + length == batch.prefill_target))
    return BatchTotals(decodes, context, prefills, float(length.sum()), prefill_attention_work(start, length),
                       completes)


def prefill_attention_work(start: np.ndarray, length: np.ndarray) -> float:
    """Sum over chunk tokens of their attention context: token j of a chunk sees ``start + j + 1`` tokens
    (the (query, key) pairs of causal chunks)."""
    return float(np.dot(length, start + (length + 1) * 0.5))


@runtime_checkable
class Backend(Protocol):
    """Executes iterations and reports how long each took.

    The engine owns scheduling and KV block accounting; the backend owns time (and, for a real model, the
    tensors that hold the cache, sized from ``num_kv_blocks * block_size``).
    """

    num_kv_blocks: int
    block_size: int
    baseline_step_s: float | None
    """The profile's flat decode latency ``l_min``; None when unknown (a policy then uses the lowest seen)."""
    owns_cache: bool
    """True when the backend holds a real KV cache of ``num_kv_blocks`` blocks of ``block_size`` tokens: the
    engine must then account in exactly those blocks (an engine config asking for others is an error)."""

    def reset(self, rng: np.random.Generator) -> None:
        """Start an episode; all randomness must come from ``rng``."""

    def execute(self, batch: StepBatch) -> float:
        """Run one iteration and return its latency in seconds (> 0)."""

    def release(self, request_ids: np.ndarray) -> None:
        """Forget the cache of finished or preempted requests."""


# A backend whose latency depends only on a batch's sizes and sums may also define
# ``execute_totals(totals: BatchTotals) -> float``, equal to ``execute`` of any batch with those totals; the
# compiled engine then times iterations without building the batch's arrays. It does so only when the class that
# defines ``execute`` defines ``execute_totals`` too: a subclass that overrides ``execute`` alone is called.
