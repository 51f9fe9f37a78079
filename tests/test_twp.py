"""Token Window Pacing: the behaviours that define it, through env.step on the calibrated backend."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.engine import State
from servegym.policies import make_policy
from servegym.policies.twp import TokenWindowPacing, TWPParams
from servegym.runner import make_env, run_episode
from tests.conftest import fixed, flat_profile


def drive(policy, env, steps, seed=0):
    obs, _ = env.reset(seed=seed)
    policy.reset()
    for _ in range(steps):
        obs, _, terminated, truncated, _ = env.step(policy.act(obs))
        if terminated or truncated:
            break
    return policy.diagnostics()


def backlog(n=300, prompt=20, output=50):
    return fixed(np.zeros(n), np.full(n, prompt), np.full(n, output))


def test_window_contracts_when_step_latency_rises():
    # T_max out of the way: forced admissions would otherwise drain the backlog after 200 steps.
    flat, steep = TokenWindowPacing(max_wait_steps=10**6), TokenWindowPacing(max_wait_steps=10**6)
    known = {"length_mode": "known"}
    d_flat = drive(flat, make_env(flat, workload=backlog(), profile=flat_profile(), engine=known), 400)
    # Beyond one request every extra request adds l_min: sigma grows with the batch TWP admits.
    steep_env = make_env(steep, workload=backlog(), profile=flat_profile(alpha_s=0.043, saturation_batch=1),
                         engine=known)
    d_steep = drive(steep, steep_env, 400)
    assert np.allclose(d_flat["sigma"], 1.0)
    assert d_flat["window"][-1] == pytest.approx(800.0, rel=0.02)  # H0 (1 + 1) with a deep queue, sigma = 1
    assert d_steep["sigma"][100:].mean() > 2.0
    assert d_steep["window"][100:].max() < 0.5 * d_flat["window"][100:].min()
    # Every rise of sigma that pushes the target below the window is followed by a smaller window.
    rises = np.flatnonzero((np.diff(d_steep["sigma"]) > 0) & (d_steep["target"][1:] < d_steep["window"][:-1]))
    assert rises.size > 0
    assert np.all(d_steep["window"][rises + 1] < d_steep["window"][rises])


def test_window_expands_when_the_queue_grows_while_itl_stays_low():
    policy = TokenWindowPacing(max_wait_steps=10**6)
    # 20 requests per second for 30 s against a window that admits ~8 at a time: the queue builds up.
    n = 600
    workload = fixed(np.linspace(0, 30, n), np.full(n, 20), np.full(n, 50))
    d = drive(policy, make_env(policy, workload=workload, profile=flat_profile(), engine={"length_mode": "known"}),
              500)
    assert np.allclose(d["sigma"], 1.0)
    early = d["num_waiting"] < 4
    deep = d["num_waiting"] >= 32
    assert early.any() and deep.any()
    assert d["window"][early].mean() < 1.3 * 400
    assert d["window"][deep].mean() > 1.8 * 400
    assert np.all(np.diff(d["window"][deep]) >= -1e-9)


def test_gate_admits_nothing_past_a_failing_candidate():
    # Window pinned at 100 tokens. A (60 tokens) runs; B (90) waits longest and fails the gate; C (5) would
    # fit but sits behind B in the ranking, so it must not be admitted while A runs.
    policy = TokenWindowPacing(initial_window=100.0, window_min=100.0, window_max=100.0,
                               weights=(1.0, 0.01, 0.001))
    env = make_env(policy, workload=fixed([0.0, 0.05, 0.3], [10, 10, 10], [60, 90, 5]),
                   engine={"length_mode": "known"}, strict_actions=True)
    obs, _ = env.reset(seed=0)
    log = env.unwrapped.engine.log
    for _ in range(45):  # A has more than 10 tokens left throughout: B cannot pass the gate
        obs, *_ = env.step(policy.act(obs))
        assert log.state[1] in (State.PENDING, State.WAITING) and log.state[2] in (State.PENDING, State.WAITING)
    assert log.state.tolist() == [State.DECODING, State.WAITING, State.WAITING]
    while log.state[1] == State.WAITING:
        obs, *_ = env.step(policy.act(obs))
    assert np.isnan(log.admit_s[2]) or log.admit_s[1] <= log.admit_s[2]  # C never overtook B


def test_request_waiting_past_t_max_is_forced_in_with_the_window_full():
    policy = TokenWindowPacing(initial_window=250.0, window_min=250.0, window_max=250.0, max_wait_steps=20)
    env = make_env(policy, workload=fixed([0.0, 0.1], [10, 10], [200, 100]), engine={"length_mode": "known"})
    obs, _ = env.reset(seed=0)
    log = env.unwrapped.engine.log
    admitted_at_wait = None
    for _ in range(60):
        waiting_before = env.unwrapped.engine.waiting.tolist()
        obs, *_ = env.step(policy.act(obs))
        if 1 in waiting_before and log.state[1] != State.WAITING:
            admitted_at_wait = env.unwrapped.engine.step_index - 1 - log.enqueue_step[1]
            break
    assert admitted_at_wait == 21  # the first step at which it has waited more than T_max = 20 steps
    assert policy.forced_total == 1
    # A still held about 175 tokens then: 175 + 100 > 250, so only the force could admit B.
    assert policy.diagnostics()["token_load"][-1] + 100 > 250


def test_chunked_prefill_bounds_prefill_tokens_per_step_at_c():
    policy = TokenWindowPacing(prefill_chunk_tokens=48)
    env = make_env(policy, workload="medium", engine={"length_mode": "predicted"})
    result = run_episode(env, policy, seed=0)
    steps = result.log.steps()
    assert steps[:, 4].max() == 48  # prefill tokens column: never above C, and C is used
    assert env.unwrapped.engine_config.prefill_chunk_tokens == 48


def test_p99_itl_under_burst_stays_below_fcfs():
    results = {}
    for name in ("fcfs", "twp"):
        policy = make_policy(name)
        env = make_env(policy, workload="burst", engine={"length_mode": "predicted"})
        results[name] = run_episode(env, policy, seed=0).summary["itl_p99"]
    assert results["twp"] < results["fcfs"]


def test_alternative_start_and_params_validation():
    assert TokenWindowPacing.from_saturation(8, 65).params.initial_window == 520.0
    with pytest.raises(ValueError, match="w1 > w2 > w3"):
        TWPParams(weights=(0.2, 0.3, 0.5))
    with pytest.raises(ValueError, match="gain"):
        TWPParams(gain=0.0)


def test_kv_guard_tightens_when_kv_is_consumed_fast_and_relaxes_after():
    policy = TokenWindowPacing(window_max=100_000.0, initial_window=50_000.0)
    # Long outputs on a small cache: KV fills quickly, then finishes drain it.
    env = make_env(policy, workload=fixed(np.zeros(40), np.full(40, 50), np.full(40, 300)),
                   engine={"num_kv_blocks": 600, "length_mode": "known"})
    d = drive(policy, env, 2000)
    guard = d["kv_guard"]
    assert guard.max() > 2 * TWPParams().kv_guard
    assert guard[-1] < guard.max()
