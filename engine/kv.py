"""Paged-KV arithmetic shared by the engine and the policies that plan admissions."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

Tokens = TypeVar("Tokens", int, float, np.ndarray)


def num_blocks(tokens: Tokens, block_size: int | float) -> Tokens:
    """Blocks that hold ``tokens`` KV tokens: ``ceil(tokens / block_size)`` (ints, floats or arrays)."""
    return -(-tokens // block_size)
