"""How many KV blocks fit: pure arithmetic, plus where the free-memory numbers come from.

On CUDA, as vLLM does with ``gpu_memory_utilization``: after the weights load and one profiling forward of
the largest batch, the cache may take ``utilization x total - peak used`` bytes. On CPU the block count is
explicit and checked against the system's available memory.
"""

from __future__ import annotations

import os

GIB = 1 << 30


class KVCapacityError(ValueError):
    """The requested KV cache does not fit in the memory available."""


def bytes_per_block(layers: int, kv_heads: int, head_dim: int, block_size: int, dtype_bytes: int) -> int:
    """Keys and values of one block in every layer."""
    return 2 * layers * kv_heads * head_dim * block_size * dtype_bytes


def peak_used_bytes(total: int, free: int, reserved: int, peak_allocated: int, profile_cache_bytes: int) -> int:
    """Device memory in use at the profiling peak, not counting the profiling run's own small KV cache: what
    other processes and the CUDA context hold (``total - free - reserved``) plus torch's peak allocation."""
    return (total - free - reserved) + peak_allocated - profile_cache_bytes


def blocks_that_fit(total_bytes: int, peak_used_bytes: int, utilization: float, block_bytes: int) -> int:
    """Blocks in the budget ``utilization x total - peak used`` (0 when the budget is spent)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"memory utilization must be in (0, 1], got {utilization}")
    budget = int(utilization * total_bytes) - peak_used_bytes
    return max(budget, 0) // block_bytes


def check_fits(num_blocks: int, block_bytes: int, available_bytes: int, where: str) -> None:
    """Raise :class:`KVCapacityError` naming the GiB needed and available when the blocks do not fit."""
    needed = num_blocks * block_bytes
    if needed > available_bytes:
        raise KVCapacityError(f"a KV cache of {num_blocks} blocks needs {needed / GIB:.2f} GiB but {where} has "
                              f"{available_bytes / GIB:.2f} GiB available; ask for at most "
                              f"{available_bytes // block_bytes} blocks")


def available_system_bytes() -> int:
    """Memory the OS can give without swapping: MemAvailable from /proc/meminfo, else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
