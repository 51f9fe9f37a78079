"""Engine dynamics: chunked prefill, analytic timing, KV preemption, conservation, the latency model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.backends import load_profile, step_latency
from servegym.engine import EngineConfig, PreemptionRule, State, compiled_available
from servegym.engine.preemption import pick_victims
from servegym.workloads import Choice, MarkovModulated, SyntheticWorkload
from tests.conftest import admit_all, fixed, make, no_action

PROFILE = load_profile("paper-v100-llama3.2-3b")
L = PROFILE.latency


def run_to_end(env, policy=admit_all, limit=100_000):
    for _ in range(limit):
        _, _, terminated, truncated, _ = env.step(policy(env))
        if terminated or truncated:
            return
    raise AssertionError("episode did not end")


def test_latency_model_is_flat_then_linear():
    batches = np.arange(0, 40)
    lat = np.array([step_latency(L, int(b)) for b in batches])
    assert np.all(lat[: L.saturation_batch + 1] == L.l_min_s)
    beyond = lat[L.saturation_batch :]
    np.testing.assert_allclose(np.diff(beyond), L.alpha_s)
    assert step_latency(L, 4, prefill_tokens=100) == pytest.approx(L.l_min_s + 100 * L.prefill_s_per_token)


def test_chunked_prefill_1000_tokens_chunk_64_takes_16_steps():
    env = make(fixed([0.0], [1000], [5]), engine={"prefill_chunk_tokens": 64})
    env.reset(seed=0)
    log = env.unwrapped.engine.log
    emitted = []
    for _ in range(16):
        _, _, _, _, info = env.step(admit_all(env))
        emitted.append(info["num_decode_tokens"])
        assert info["num_prefill_tokens"] <= 64
    assert emitted == [0] * 15 + [1]
    assert log.first_token_s[0] == pytest.approx(env.unwrapped.engine.clock)


@pytest.mark.parametrize(("prompt", "output", "chunk"), [(1000, 20, 64), (37, 1, 512), (300, 50, 128)])
def test_single_request_finishes_when_the_profile_predicts(prompt, output, chunk):
    arrival = 3.5
    env = make(fixed([arrival], [prompt], [output]), engine={"prefill_chunk_tokens": chunk})
    env.reset(seed=0)
    run_to_end(env)
    # Independent arithmetic: ceil(p/C) prefill steps (the last emits token 1), then o - 1 decode steps of l(1).
    expected, start = arrival, 0
    while start < prompt:
        c = min(chunk, prompt - start)
        attention = c * start + c * (c + 1) / 2
        expected += L.l_min_s + L.prefill_s_per_token * c + L.prefill_s_per_token_context * attention
        start += c
    expected += (output - 1) * L.l_min_s
    log = env.unwrapped.engine.log
    assert log.finish_s[0] == pytest.approx(expected, rel=1e-12)
    assert len(log.token_times(0)) == output


def small_kv_env(rule: str, blocks: int = 10):
    # Three 32-token prompts (2 blocks each) that each want 100 output tokens: they overflow 10 blocks.
    workload = fixed([0.0, 0.0, 0.0], [32, 32, 32], [100, 100, 100])
    return make(workload, engine={"num_kv_blocks": blocks, "block_size": 16, "preemption": rule})


def step_until_preemption(env, limit=200):
    for _ in range(limit):
        _, _, _, _, info = env.step(admit_all(env) if env.unwrapped.engine.num_running == 0 else no_action(env))
        if info["num_preemptions"]:
            return info
    raise AssertionError("no preemption happened")


def test_lifo_preempts_the_most_recently_activated():
    env = small_kv_env("lifo")
    env.reset(seed=0)
    step_until_preemption(env)
    log = env.unwrapped.engine.log
    assert log.num_preemptions.tolist() == [0, 0, 1]
    assert log.state[2] == State.PREEMPTED
    assert env.unwrapped.engine.waiting.tolist() == [2]


def test_clear_all_preempts_every_running_request():
    env = small_kv_env("clear_all")
    env.reset(seed=0)
    info = step_until_preemption(env)
    assert info["num_preemptions"] == 3 and info["num_running"] == 0
    assert env.unwrapped.engine.waiting.tolist() == [0, 1, 2]
    assert env.unwrapped.engine.num_used_blocks == 0


def test_preempted_request_recomputes_and_keeps_its_tokens():
    env = small_kv_env("lifo", blocks=12)
    env.reset(seed=0)
    run_to_end(env)
    log = env.unwrapped.engine.log
    assert log.num_preemptions.sum() >= 1
    for r in range(3):
        times = log.token_times(r)
        assert times.size == 100 and np.all(np.diff(times) > 0)
    assert np.all(log.state == State.FINISHED)


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_eviction_refuses_rows_that_are_not_distinct_running_rows_and_changes_nothing(monkeypatch, engine):
    # Rows past the table, negative, one past the last running row, or the same row twice (which would free its
    # blocks twice): each is an IndexError raised before any request changes state.
    if engine == "compiled" and not compiled_available():
        pytest.skip("the compiled engine is not built")
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    env = make(fixed([0.0, 0.0, 0.0], [40, 40, 40], [9, 9, 9]))
    env.reset(seed=0)
    env.step(admit_all(env))
    eng, log = env.unwrapped.engine, env.unwrapped.engine.log
    running, used, states = eng.running_ids.tolist(), eng.num_used_blocks, log.state.copy()
    assert len(running) == 3
    for bad in (np.arange(5000) + 1000, np.array([-1]), np.array([3]), np.array([1, 1]), np.array([2, 0, 2])):
        with pytest.raises(IndexError, match="distinct running rows"):
            eng._evict(bad)
        assert eng.running_ids.tolist() == running and eng.num_used_blocks == used
        assert np.array_equal(log.state, states) and log.num_preemptions.sum() == 0 and eng.waiting.size == 0
    assert eng._evict(np.array([2, 0])) == 2  # the valid case: both to the queue front, in the order given
    assert eng.running_ids.tolist() == [running[1]] and eng.waiting.tolist() == [running[2], running[0]]


@pytest.mark.parametrize("engine", ["python", "compiled"])
@pytest.mark.parametrize("recompute, finish, emitted", [("keep_output", [6.0, 8.0], [6, 6]),
                                                        ("restart", [6.0, 11.0], [6, 10])])
def test_restart_loses_the_evicted_requests_progress(monkeypatch, engine, recompute, finish, emitted):
    # Discrete time (1 s a step), 16 one-token blocks, two 4-token prompts wanting 6 tokens each, admitted at once.
    # After 4 tokens each, step 5 needs 2 x (4 + 4 + 1) = 18 blocks: LIFO evicts the second with 4 generated.
    # keep_output: it needs 8 blocks to come back, A holds 9 then 10 of 16, so it returns at step 7 after A
    # finishes (t = 6), re-ingests prompt and tokens in one step and emits tokens 5, 6 at t = 7, 8.
    # restart: it needs only its 4 prompt blocks, returns at step 6 beside A (10 + 4 <= 16) and regenerates all
    # 6 tokens, at t = 6..11: 10 tokens emitted in all, 4 of them wasted.
    if engine == "compiled" and not compiled_available():
        pytest.skip("the compiled engine is not built")
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    env = make(fixed([0.0, 0.0], [4, 4], [6, 6]), profile="discrete-time",
               engine={"num_kv_blocks": 16, "block_size": 1, "preemption": "lifo", "recompute": recompute,
                       "max_num_seqs": 8, "max_num_batched_tokens": 64, "prefill_chunk_tokens": 64})
    env.reset(seed=0)
    log = env.unwrapped.engine.log
    for step in range(1, 20):
        _, _, terminated, _, info = env.step(admit_all(env))
        if info["num_preemptions"]:
            assert step == 5
            assert log.num_generated_at_preemption.tolist() == [0, 4 if recompute == "keep_output" else 0]
        if terminated:
            break
    assert log.num_preemptions.tolist() == [0, 1]
    assert log.finish_s.tolist() == finish
    assert [log.token_times(r).size for r in range(2)] == emitted
    env.close()


def test_recompute_is_checked():
    with pytest.raises(ValueError, match="recompute must be one of"):
        EngineConfig(recompute="resume")


def test_victim_rules():
    gen = np.array([5, 2, 9, 2])
    assert pick_victims(PreemptionRule.LIFO, gen).tolist() == [3]
    assert pick_victims(PreemptionRule.CLEAR_ALL, gen).tolist() == [0, 1, 2, 3]
    assert pick_victims(PreemptionRule.FEWEST_GENERATED, gen).tolist() == [3]
    assert pick_victims(PreemptionRule.FEWEST_GENERATED, np.array([1, 7, 3])).tolist() == [0]


def test_fewest_generated_spares_a_newer_request_with_more_tokens():
    # Request 0 runs alone for a while, gets preempted by growth, then returns with its tokens; the newer
    # request 1 has fewer generated tokens, so it is evicted first even though request 0 is newer in the batch.
    env = make(fixed([0.0, 0.0], [16, 16], [60, 60]), engine={"num_kv_blocks": 7, "block_size": 16,
                                                              "preemption": "fewest_generated"})
    env.reset(seed=0)
    one = np.zeros(env.unwrapped.queue_window, dtype=np.int64)
    one[0] = 1
    for _ in range(30):
        env.step(one if env.unwrapped.engine.num_running == 0 else no_action(env))
    env.step(one)  # admit request 1 beside request 0 (which holds 30 tokens already)
    step_until_preemption(env)
    assert env.unwrapped.engine.log.num_preemptions.tolist() == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["lifo", "clear_all", "fewest_generated"])
def test_conservation_under_random_actions(rule):
    workload = SyntheticWorkload(
        MarkovModulated(2.0, 30.0, 5.0, 2.0), 600.0,
        prompt=Choice((50, 200, 800, 4000), (0.4, 0.3, 0.25, 0.05)), output=Choice((20, 50, 200), (0.5, 0.3, 0.2)),
    )
    env = make(workload, engine={"num_kv_blocks": 200, "preemption": rule, "check_invariants": True,
                                 "max_num_seqs": 32, "prefill_chunk_tokens": 256})
    env.reset(seed=11)
    env.action_space.seed(11)
    rng = np.random.default_rng(11)
    steps = preempted = 0
    while steps < 10_000:
        action = env.action_space.sample() * (rng.random(env.unwrapped.queue_window) < 0.1)
        _, _, terminated, truncated, info = env.step(action)
        preempted += info["num_preemptions"]
        steps += 1
        counts = env.unwrapped.engine.log.counts()
        assert counts["num_arrived"] == counts["num_waiting"] + counts["num_running"] + \
            counts["num_finished"] + counts["num_rejected"]
        if terminated or truncated:
            env.reset()
    log = env.unwrapped.engine.log
    assert preempted > 0
    assert log.counts()["num_rejected"] > 0 or np.any(log.reject_reason)


def test_request_larger_than_kv_is_rejected_and_counted():
    env = make(fixed([0.0, 0.1], [5000, 10], [10, 10]), engine={"num_kv_blocks": 100, "block_size": 16})
    _, info = env.reset(seed=0)
    assert info["num_rejected"] == 1 and info["num_arrived"] == 1
    run_to_end(env)
    log = env.unwrapped.engine.log
    assert log.state.tolist() == [State.REJECTED, State.FINISHED]
    assert log.reject_reason[0] == 1


def test_clock_jumps_to_next_arrival_when_idle():
    env = make(fixed([0.0, 100.0], [10, 10], [2, 2]))
    env.reset(seed=0)
    for _ in range(2):  # prefill + first token, then the second token: request 0 is done
        _, _, _, _, info = env.step(admit_all(env))
    assert info["num_finished"] == 1 and info["clock_s"] < 1.0
    _, _, _, _, info = env.step(admit_all(env))
    assert info["clock_s"] == 100.0 and info["num_waiting"] == 1 and info["num_decode_tokens"] == 0


def test_step_after_episode_end_raises():
    env = make(fixed([0.0], [10], [1]))
    env.reset(seed=0)
    _, _, terminated, _, _ = env.step(admit_all(env))
    assert terminated
    with pytest.raises(RuntimeError, match="reset"):
        env.step(admit_all(env))


def test_outputs_longer_than_max_tokens_are_truncated_and_flagged():
    env = make(fixed([0.0], [10], [500]), engine={"max_tokens": 100})
    env.reset(seed=0)
    run_to_end(env)
    log = env.unwrapped.engine.log
    assert log.truncated[0] and log.token_times(0).size == 100


def test_token_budget_caps_each_iteration():
    env = make(fixed(np.zeros(40), np.full(40, 500), np.full(40, 30)),
               engine={"max_num_batched_tokens": 1024, "prefill_chunk_tokens": 256, "max_num_seqs": 64})
    env.reset(seed=0)
    for _ in range(60):
        _, _, terminated, _, info = env.step(admit_all(env))
        assert info["num_prefill_tokens"] + info["num_decode_tokens"] <= 1024 + info["num_running"]
        if terminated:
            break
    steps = env.unwrapped.engine.log.steps()
    assert steps[:, 4].max() <= 1024 and math.isclose(steps[:, 4].max(), 1024)


def test_shortest_predicted_evicts_the_smallest_amin_estimate_not_the_fewest_generated():
    # Rows (oldest first): lo = 50, 8, 30 with hi = 400, generated = 3, 20, 1. A_min's estimates: 50 (3 < 50);
    # 8 doubled past 20 -> 32; 30. Shortest predicted evicts row 2 (estimate 30); fewest-generated would evict
    # row 2 as well, so also check a case where they differ: generated = 0, 20, 31 -> estimates 50, 32, 60
    # (31 outgrew 30, so it doubled): shortest predicted evicts row 1, fewest generated row 0.
    lo, hi = np.array([50, 8, 30]), np.full(3, 400)
    assert pick_victims(PreemptionRule.SHORTEST_PREDICTED, np.array([3, 20, 1]), lo, hi).tolist() == [2]
    gen = np.array([0, 20, 31])
    assert pick_victims(PreemptionRule.SHORTEST_PREDICTED, gen, lo, hi).tolist() == [1]
    assert pick_victims(PreemptionRule.FEWEST_GENERATED, gen, lo, hi).tolist() == [0]
    # Ties go to the most recently activated row.
    assert pick_victims(PreemptionRule.SHORTEST_PREDICTED, np.zeros(3), np.full(3, 10), hi).tolist() == [2]


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_step_rows_are_plain_tuples_of_numbers_the_collector_lets_go(monkeypatch, engine):
    """The step log grows by a row an iteration for the whole episode: rows the cyclic collector kept tracking
    (a NamedTuple, a list, an object inside) would be traversed by every full collection."""
    import gc

    if engine == "compiled" and not compiled_available():
        pytest.skip("the compiled engine is not built")
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    env = make(fixed([0.0, 0.1, 0.2], [30, 50, 70], [4, 3, 6]), engine={"prefill_chunk_tokens": 16})
    env.reset(seed=0)
    run_to_end(env)
    rows = env.unwrapped.cluster.log.step_rows[0]
    gc.collect()
    assert len(rows) > 5 and all(type(row) is tuple for row in rows)
    assert not any(gc.is_tracked(row) for row in rows)
