"""The engine's prefix cache against the trace's own hash ids: the first 2,000 requests of the Mooncake conversation
trace, served one at a time (one sequence slot, one output token, the whole prompt in one chunk), so that no
request runs beside another and each finds exactly what earlier ones left."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.runner import make_env
from servegym.workloads import MooncakeWorkload, trace_hit_ratio

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # one iteration per request trips the stall hint
FIRST = MooncakeWorkload("conversation", max_requests=2000)
UNIT_BLOCKS = 512 // 16
"""KV blocks of 16 tokens per 512-token prefix block (the a100-llama3-8b profile's block size)."""


def served(num_kv_blocks: int) -> dict[str, float]:
    env = make_env(None, workload=FIRST, profile="a100-llama3-8b", max_episode_steps=1_000_000, engine={
        "prefix_caching": True, "max_num_seqs": 1, "max_tokens": 1, "prefill_chunk_tokens": 131_072,
        "max_num_batched_tokens": 131_072, "num_kv_blocks": num_kv_blocks})
    env.reset(seed=0)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
        done = terminated or truncated
    log = env.unwrapped.cluster.log
    assert log.counts()["num_finished"] == 2000  # every request served, none refused for size
    from servegym.metrics import summarize

    return summarize(log)


def test_an_unbounded_cache_hits_what_the_trace_says_to_half_a_point():
    spec = FIRST.sample(np.random.default_rng(0))
    expected = trace_hit_ratio(spec)
    units = int(np.unique(spec.prefix.hashes).size)
    summary = served(2 * units * UNIT_BLOCKS)  # room for every block twice over
    assert expected > 0.2  # the comparison means something: the trace reuses a fifth of its prompt tokens or more
    assert abs(summary["prefix_hit_ratio"] - expected) <= 0.005
    assert summary["prefix_host_hit_ratio"] == 0.0


@pytest.mark.parametrize("units", [300, 800])
def test_a_finite_cache_never_beats_an_lru_of_as_many_blocks(units):
    spec = FIRST.sample(np.random.default_rng(0))
    lru = trace_hit_ratio(spec, capacity_blocks=units)
    summary = served(units * UNIT_BLOCKS)
    assert summary["prefix_hit_ratio"] <= lru + 1e-12
    assert summary["prefix_hit_ratio"] > 0.5 * lru  # and it is an LRU cache, not an empty one
