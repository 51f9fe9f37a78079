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
