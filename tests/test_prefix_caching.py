"""Prefix caching in the engine, computed by hand: blocks held, tokens prefilled, step times, LRU order, held units
never evicted, a preempted request's return, and host-tier hits charged their copy.

Every case uses KV blocks of 4 tokens and prefix units of 8 tokens (2 blocks), so a unit and a block differ. The
latency model: 10 ms per iteration, 1 ms per prefill token, 10 us per (chunk token, context token) pair; so a chunk
of n tokens over c cached ones costs ``n * 1 ms + n * (c + (n + 1) / 2) * 10 us``. Each case runs on both ways of
running the engine, with every invariant checked after every step.
"""

from __future__ import annotations

import numpy as np
import pytest

from servegym.backends import CalibratedBackend, LatencyModel, Profile
from servegym.engine import EngineConfig, compiled_available
from servegym.engine.prefix_cache import PrefixCache
from servegym.metrics import summarize
from servegym.runner import make_env
from servegym.workloads import FixedWorkload, PrefixChains, RequestSpec

ENGINES = ["python", pytest.param("compiled", marks=pytest.mark.skipif(not compiled_available(),
                                                                        reason="the compiled engine is not built"))]
L_MIN, PER_TOKEN, PER_PAIR = 0.01, 0.001, 1e-5


@pytest.fixture(params=ENGINES, autouse=True)
def engine(request, monkeypatch) -> str:
    monkeypatch.setenv("SERVEGYM_ENGINE", request.param)
    return request.param


def backend(num_kv_blocks: int = 1000, hardware: str = "none") -> CalibratedBackend:
    latency = LatencyModel(l_min_s=L_MIN, saturation_batch=10**6, alpha_s=0.0, prefill_s_per_token=PER_TOKEN,
                           prefill_s_per_token_context=PER_PAIR)
    return CalibratedBackend(Profile("test", latency, num_kv_blocks, 4, 0.0, {
        "hardware": hardware, "model": "none", "method": "test fixture", "date": "2026-12-05"}))


def workload(arrival, prompt, output, chains) -> FixedWorkload:
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in chains])])
    hashes = np.array([h for c in chains for h in c], dtype=np.int64)
    return FixedWorkload(RequestSpec(np.asarray(arrival, dtype=float), np.asarray(prompt), np.asarray(output),
                                     PrefixChains(offsets, hashes, 8)))


def env_for(work, num_kv_blocks=1000, backend_=None, **engine):
    env = make_env(None, workload=work, backend=backend_ or backend(num_kv_blocks),
                   engine={"prefix_caching": True, "check_invariants": True, **engine})
    env.reset(seed=0)
    return env


def step(env, times: int = 1) -> None:
    for _ in range(times):
        env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))


def chunk_s(n: int, cached: int) -> float:
    return n * PER_TOKEN + n * (cached + (n + 1) / 2) * PER_PAIR


def test_three_requests_sharing_a_two_unit_prefix():
    # Request 0 (prompt 20, chain [10, 11, 12]: units 10 and 11 are full, 12 holds its last 4 tokens) prefills alone
    # at t=0: 20 tokens over no cache, 10 + 20 + 2.1 ms. It registers units 10 and 11 and holds 21 KV tokens (6 blocks).
    # Requests 1 (prompt 18, chain [10, 11, 20]) and 2 (prompt 16, chain [10, 11]) arrive at 0.05 s, after iterations
    # ending at 0.0321, 0.0421 and 0.0521. Request 1 reuses both units (16 tokens) and prefills 2; request 2 may not
    # reuse unit 11, which holds its last prompt token, so it reuses 8 and prefills 8 (its own copy of unit 11
    # stays private: the cache has one). That iteration: 10 ms + 2 chunks' costs.
    env = env_for(workload([0.0, 0.05, 0.05], [20, 18, 16], [100, 100, 100], [[10, 11, 12], [10, 11, 20], [10, 11]]))
    step(env, 4)
    cluster = env.unwrapped.cluster
    log, eng = cluster.log, cluster.engines[0]
    steps = log.steps()
    assert steps[0, 1] == pytest.approx(L_MIN + chunk_s(20, 0), abs=1e-12)
    assert steps[3, 1] == pytest.approx(L_MIN + chunk_s(2, 16) + chunk_s(8, 8), abs=1e-12)
    assert steps[3, 4] == 10  # prefill tokens
    assert log.cached_gpu_tokens.tolist() == [0, 16, 8]
    assert log.cached_host_tokens.tolist() == [0, 0, 0]
    # KV after iteration 4: request 0 holds 24 tokens (6 blocks), 1 holds 16 + 2 + 1 = 19 (5), 2 holds 8 + 8 + 1 = 17
    # (5). Units 10 and 11 (4 blocks) count once: 6 + 5 + 5 - 4 - 4 - 2 = 6 private blocks, 10 in all (16 without).
    assert eng.running[:, 1].tolist() == [24, 19, 17]
    assert eng.num_used_blocks == 10
    assert eng.prefix_cache.refs == {10: 3, 11: 2}


def test_free_units_are_evicted_least_recently_used_first_tail_before_head():
    # A 12-block cache. A (chain [1, 2]), B ([3, 4]) and C ([5, 6]) each prefill 16 tokens and finish at once (one
    # output token): 17 KV tokens, 5 blocks, units released tail first. After B the free list is [2, 1, 4, 3]
    # (8 blocks); C's 5 blocks make 13 > 12, so one unit goes: unit 2, A's tail, not its head 1. D (prompt 17,
    # chain [1, 2, 9]) then reuses unit 1 only: 8 tokens.
    arrival = [0.0, 1.0, 2.0, 3.0]
    env = env_for(workload(arrival, [16, 16, 16, 17], [1, 1, 1, 1], [[1, 2], [3, 4], [5, 6], [1, 2, 9]]),
                  num_kv_blocks=12)
    cache = None
    for _ in range(40):
        step(env)
        cache = env.unwrapped.cluster.engines[0].prefix_cache
        if env.unwrapped.cluster.log.finish_s[2] == env.unwrapped.cluster.log.finish_s[2]:
            break
    assert list(cache.free) == [1, 4, 3, 6, 5]
    while env.unwrapped.cluster.log.finish_s[3] != env.unwrapped.cluster.log.finish_s[3]:
        step(env)
    assert env.unwrapped.cluster.log.cached_gpu_tokens.tolist() == [0, 0, 0, 8]


def test_a_unit_a_running_request_holds_is_never_evicted():
    cache = PrefixCache(PrefixChains(np.array([0, 2, 4]), np.array([1, 2, 3, 4]), 8), block_size=4)
    cache.acquire(0, 0)
    cache.register(0, 16)  # request 0 holds units 1 and 2
    cache.acquire(1, 0)
    cache.register(1, 16)
    cache.release(1)  # units 4, 3 free
    assert cache.evict(10) == 2  # only the free ones go
    assert cache.refs == {1: 1, 2: 1} and not cache.free
    # In an engine: E holds [3, 4] while F's blocks push the free unit 2 (A's tail) out; E's units stay.
    env = env_for(workload([0.0, 0.5, 0.6], [16, 16, 16], [1, 40, 1], [[1, 2], [3, 4], [5, 6]]), num_kv_blocks=14)
    log = env.unwrapped.cluster.log
    while log.finish_s[2] != log.finish_s[2]:
        step(env)
    refs = env.unwrapped.cluster.engines[0].prefix_cache.refs
    assert refs[3] == 1 and refs[4] == 1 and 2 not in refs and 1 in refs


def test_a_preempted_request_finds_its_prompt_cached_on_its_return():
    # An 11-block cache; X (chain [1, 2], 8 output tokens) and Y ([3, 4], 20) prefill 16 tokens each at t=0 (5
    # blocks each). At KV 20 both need a sixth block, one is free: Y (the newest) is evicted with 4 tokens generated
    # and its units stay cached. Y returns once X finishes: its target is 16 + 4 = 20 tokens, both units hit (16)
    # and it prefills the 4 output tokens only.
    env = env_for(workload([0.0, 0.0], [16, 16], [8, 20], [[1, 2], [3, 4]]), num_kv_blocks=11)
    log = env.unwrapped.cluster.log
    while log.finish_s[1] != log.finish_s[1]:
        step(env)
    steps = log.steps()
    assert log.num_preemptions.tolist() == [0, 1]
    assert log.num_generated_at_preemption[1] == 4
    returns = np.flatnonzero(steps[:, 8] > 0)[1]  # the second iteration that admitted anything
    assert steps[returns, 4] == 4  # prefill tokens: the recomputed output only
    assert steps[returns, 1] == pytest.approx(L_MIN + chunk_s(4, 16), abs=1e-12)
    assert log.cached_gpu_tokens[1] == 0  # the hit ratio counts first admissions


def test_a_host_hit_is_charged_its_copy_to_the_iteration_that_loads_it():
    # A 12-block cache and a 2-unit host tier; copying one token's KV takes 1e5 B / 1e9 B/s = 0.1 ms. A (chain
    # [1, 2]) finishes: free [2, 1]. B (prompt 32, chain [5, 6, 7, 8]) needs 9 blocks: 9 + 4 > 12, so unit 2 moves
    # to the host. C (prompt 17, chain [1, 2, 3]) finds unit 1 in GPU memory and unit 2 on the host: 8 + 8 tokens
    # cached, 1 token prefilled, and its iteration pays the copy of 8 tokens, 0.8 ms.
    slow = backend(12)
    slow.kv_bytes_per_token = 1e5
    env = env_for(workload([0.0, 1.0, 2.0], [16, 32, 17], [1, 1, 1], [[1, 2], [5, 6, 7, 8], [1, 2, 3]]),
                  backend_=slow, host_kv_tokens=16, host_link_bytes_s=1e9)
    log = env.unwrapped.cluster.log
    while log.finish_s[2] != log.finish_s[2]:
        obs, *_ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
    assert log.cached_gpu_tokens.tolist() == [0, 0, 8]
    assert log.cached_host_tokens.tolist() == [0, 0, 8]
    last = log.steps()[-1]
    assert last[4] == 1
    assert last[1] == pytest.approx(L_MIN + chunk_s(1, 16) + 8 * 1e5 / 1e9, abs=1e-12)
    # The hit ratio over the 65 admitted prompt tokens: 8 + 8 cached, 8 of them from the host.
    summary = summarize(log)
    assert summary["prefix_hit_ratio"] == pytest.approx(16 / 65, abs=1e-12)
    assert summary["prefix_host_hit_ratio"] == pytest.approx(8 / 65, abs=1e-12)
    # C's copy-back left the free list short: one more GPU unit, B's tail 8, went to the host.
    assert obs["prefix"][1] == 8.0


def test_the_host_link_of_a_shipped_profile_is_its_gpus_pcie_rate():
    from servegym.backends import load_profile

    b = CalibratedBackend(load_profile("a100-llama3-8b"))
    assert b.host_link_bytes_s == 31.5e9 and b.kv_bytes_per_token == 131072.0
    assert CalibratedBackend(load_profile("h100-llama2-7b")).host_link_bytes_s == 63.0e9


def test_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="host_kv_tokens needs prefix_caching"):
        EngineConfig(host_kv_tokens=16)
    with pytest.raises(ValueError, match="host_link_bytes_s"):
        EngineConfig(prefix_caching=True, host_link_bytes_s=0)
    with pytest.raises(ValueError, match="whole number"):
        PrefixCache(PrefixChains(np.array([0, 1]), np.array([1]), 6), block_size=4)
    with pytest.raises(ValueError, match="host-link bandwidth"):  # schema-1 profiles state no KV bytes per token
        env_for(workload([0.0], [16], [1], [[1, 2]]), host_kv_tokens=16)


def test_with_prefix_caching_off_a_shared_prefix_is_prefilled_again():
    env = make_env(None, workload=workload([0.0, 0.05], [20, 18], [100, 100], [[10, 11, 12], [10, 11, 20]]),
                   backend=backend(), engine={"check_invariants": True})
    env.reset(seed=0)
    step(env, 4)
    log = env.unwrapped.cluster.log
    assert log.steps()[3, 4] == 18 and log.cached_gpu_tokens.tolist() == [0, 0]


def test_the_observation_shows_each_visible_requests_cached_tokens_and_the_free_cached_blocks():
    # A (chain [1, 2], one output token) finishes: units 2 and 1 free, 4 blocks. B (prompt 17, chain [1, 2, 3])
    # and C (prompt 16, chain [1, 2]) then wait: B would find 16 tokens cached, C only 8 (unit 2 holds its last
    # token). Flat and Dict observations agree, in gymnasium.spaces.flatten's layout.
    from gymnasium import spaces

    from servegym.envs.observation import queue_prefix_matrix

    work = workload([0.0, 1.0, 1.0], [16, 17, 16], [1, 5, 5], [[1, 2], [1, 2, 3], [1, 2]])
    env = env_for(work)
    step(env)  # A prefills and finishes
    obs = None
    while env.unwrapped.cluster.engines[0].waiting.size < 2:
        obs, *_ = env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    assert obs["prefix"].tolist() == [4.0, 0.0]
    assert queue_prefix_matrix(obs)[:3].tolist() == [[16.0, 0.0], [8.0, 0.0], [0.0, 0.0]]
    flat = make_env(None, workload=work, backend=backend(), flat_obs=True,
                    engine={"prefix_caching": True, "check_invariants": True})
    flat.reset(seed=0)
    step(flat)
    while flat.unwrapped.cluster.engines[0].waiting.size < 2:
        flat_obs, *_ = flat.step(np.zeros(flat.unwrapped.queue_window, dtype=np.int64))
    assert np.array_equal(flat_obs, spaces.flatten(env.unwrapped.dict_observation_space, obs))
    assert env.observation_space.contains(obs)


def test_without_prefix_caching_the_observation_has_no_prefix_keys():
    env = make_env(None, workload=workload([0.0], [16], [1], [[1, 2]]), backend=backend())
    obs, _ = env.reset(seed=0)
    assert "prefix" not in obs and "queue_prefix" not in obs


def test_two_requests_computing_the_same_unit_cache_one_copy_and_stop_there():
    # A (chain [1, 2]) and B (chain [1, 3]) prefill together: A registers units 1 and 2; B finds unit 1 cached by
    # A, keeps its own copy private and registers nothing after it (its unit 3 is not a continuation of a cached
    # chain). Blocks: 5 + 5, none shared.
    env = env_for(workload([0.0, 0.0], [16, 16], [3, 3], [[1, 2], [1, 3]]))
    step(env)
    eng = env.unwrapped.cluster.engines[0]
    assert eng.prefix_cache.refs == {1: 1, 2: 1}
    assert eng.prefix_cache.held_units(1) == 0 and eng.num_used_blocks == 10


def test_a_resumed_request_never_reuses_its_partial_last_prompt_unit():
    # B's 12-token prompt fills unit 1 and a third of unit 2, whose id A (16 tokens) cached as a whole unit. As a
    # preempted request with 6 tokens to recompute, B's last token to ingest lies past its prompt, yet only its
    # whole prompt unit counts: 8 tokens, not 16.
    env = env_for(workload([0.0, 1.0], [16, 12], [1, 5], [[1, 2], [1, 2]]))
    step(env)
    log = env.unwrapped.cluster.log
    while env.unwrapped.cluster.engines[0].waiting.size < 1:
        env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    assert env.unwrapped.cluster.engines[0].cached_prompt_tokens(1) == (8, 0)
    log.num_generated_at_preemption[1] = 6
    assert env.unwrapped.cluster.engines[0].cached_prompt_tokens(1) == (8, 0)


def test_the_observation_counts_only_unreferenced_cached_blocks_as_free():
    # A (chain [1, 2], 40 output tokens) runs holding both units; B waits: no cached block is free.
    env = env_for(workload([0.0, 0.1], [16, 17], [40, 5], [[1, 2], [1, 2, 3]]))
    step(env)
    obs = None
    while env.unwrapped.cluster.engines[0].waiting.size < 1:
        obs, *_ = env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    assert obs["prefix"].tolist() == [0.0, 0.0]
    assert obs["queue_prefix"][:2].tolist() == [16.0, 0.0]


def test_prefix_caching_on_a_workload_without_chains_changes_nothing_in_the_episode():
    # Nothing to share: the same iterations, token times and step log as with prefix caching off (only the
    # observation gains its two keys, all zeros).
    from servegym.workloads import make_workload

    logs = []
    for on in (False, True):
        env = make_env(None, workload=make_workload("burst"), engine={"prefix_caching": on, "num_kv_blocks": 300},
                       max_episode_steps=400)
        env.reset(seed=3)
        for _ in range(400):
            obs, _, terminated, truncated, _ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
            if terminated or truncated:
                break
        logs.append(env.unwrapped.cluster.log)
        if on:
            assert not obs["prefix"].any() and not obs["queue_prefix"].any()
    assert np.array_equal(logs[0].steps(), logs[1].steps())
    assert logs[0].seg_req == logs[1].seg_req and logs[0].seg_last == logs[1].seg_last
