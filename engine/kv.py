"""Paged-KV arithmetic shared by the engine and the policies that plan admissions."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

Tokens = TypeVar("Tokens", int, float, np.ndarray)


def num_blocks(tokens: Tokens, block_size: int | float) -> Tokens:
    """Blocks that hold ``tokens`` KV tokens: ``ceil(tokens / block_size)`` (ints, floats or arrays)."""
    return -(-tokens // block_size)


def first_chunk_tokens(prefill_target: Tokens, prefill_chunk_tokens: int | float) -> Tokens:
    """KV tokens a request holds after its first iteration: its first prompt chunk, plus the sampled token
    when that chunk completes the prefill (``prefill_target`` = prompt + output tokens to recompute)."""
    if isinstance(prefill_target, int):  # the engine's per-request path: stay in plain ints
        first = min(int(prefill_chunk_tokens), prefill_target)
        return first + (first == prefill_target)
    first = np.minimum(prefill_chunk_tokens, prefill_target)
    return first + (first == prefill_target)
