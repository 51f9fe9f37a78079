"""Matching a prompt against the prefix cache: time per lookup by chain length and by cache size.

Usage: python benchmarks/prefix_match.py [--repeats 5]

A cache holding ``units`` prefix units (all free, as after many finished requests) is asked for the cached run of
a chain of ``length`` units that all hit (the worst case: every unit is looked up). The figure is the best of
``--repeats`` timings of 2,000 lookups. Lookups are dictionary probes, so the time grows with the chain's length
and stays flat as the cache grows; the printed ratios say so.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from servegym.engine.engine import leading_run
from servegym.engine.prefix_cache import PrefixCache
from servegym.workloads import PrefixChains

LOOKUPS = 2_000


def lookup_us(units: int, length: int, repeats: int) -> float:
    offsets = np.arange(0, units + 1, length)
    chains = PrefixChains(offsets, np.arange(offsets[-1]), 512)
    cache = PrefixCache(chains, block_size=16)
    for request in range(len(chains)):  # every unit cached and free
        cache.acquire(request, 0)
        cache.register(request, length * 512)
        cache.release(request)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(LOOKUPS):
            leading_run(cache.chain(i % len(chains)), length, cache.refs, cache.host)
        best = min(best, (time.perf_counter() - start) / LOOKUPS * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes, lengths = (4_096, 65_536, 1_048_576), (8, 32, 128)
    table = {(u, n): lookup_us(u, n, args.repeats) for u in sizes for n in lengths}
    print(f"{'cached units':>13} " + " ".join(f"{f'{n} units us':>12}" for n in lengths))
    for u in sizes:
        print(f"{u:>13,} " + " ".join(f"{table[u, n]:>12.2f}" for n in lengths))
    small, large = sizes[0], sizes[-1]
    print(f"cache {large // small}x larger, chain of 32: x{table[large, 32] / table[small, 32]:.2f} time")
    print(f"chain 16x longer (8 -> 128), cache of {small:,}: x{table[small, 128] / table[small, 8]:.2f} time")


if __name__ == "__main__":
    main()
