"""Token Window Pacing: the behaviours that define it, through env.step on the calibrated backend."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.engine import STEP_INDEX, State
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
    # T_max out of the way: forced admissions would otherwise drain the backlog after 200 steps; the parallelism
    # floor too, so that the window rule alone moves the window.
    flat = TokenWindowPacing(max_wait_steps=10**6, min_active_requests=None)
    steep = TokenWindowPacing(max_wait_steps=10**6, min_active_requests=None)
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
    # B0 = 8 given: the flat test profile's own B0 (10^6) would pin the window at window_max.
    policy = TokenWindowPacing(max_wait_steps=10**6, min_active_requests=8)
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


@pytest.mark.slow
def test_total_chunking_bounds_prefill_tokens_per_step_at_c():
    policy = TokenWindowPacing(prefill_chunk_tokens=48, chunking="total")
    env = make_env(policy, workload="medium", engine={"length_mode": "predicted"})
    result = run_episode(env, policy, seed=0)
    steps = result.log.steps()
    assert steps[:, STEP_INDEX["num_prefill_tokens"]].max() == 48  # never above C, and C is used
    assert env.unwrapped.engine_config.prefill_chunk_tokens == 48


def test_per_request_chunking_gives_each_prompt_one_chunk_of_c_per_step():
    # The paper's reading: "fixed-size chunks processed one per decode step", per request. Three 200-token
    # prompts admitted together ingest 64 tokens each in the first step (192 in all): 64, 64, 64, then 8 each.
    policy = TokenWindowPacing(prefill_chunk_tokens=64, initial_window=10_000.0, window_max=10_000.0)
    env = make_env(policy, workload=fixed(np.zeros(3), np.full(3, 200), np.full(3, 5)), profile=flat_profile(),
                   engine={"length_mode": "known"})
    result = run_episode(env, policy, seed=0)
    prefill = result.log.steps()[:, STEP_INDEX["num_prefill_tokens"]]
    assert prefill[:4].tolist() == [192, 192, 192, 24]
    assert env.unwrapped.engine_config.max_prefill_tokens is None


def test_window_floor_keeps_b0_requests_worth_of_tokens():
    # min_active_requests = 8 (the paper's B0): running requests with a mean of 200 tokens left give a
    # floor of 1600; with nothing running, the waiting requests' mean (50) gives 400; never below window_min or
    # above window_max; None leaves window_min alone.
    policy = TokenWindowPacing(window_min=32.0, window_max=1000.0)
    assert policy._window_floor(200.0, np.array([50.0])) == 1000.0  # capped at window_max
    policy = TokenWindowPacing(window_min=32.0, window_max=4096.0)
    assert policy._window_floor(200.0, np.array([50.0])) == 1600.0
    assert policy._window_floor(None, np.array([40.0, 60.0])) == 400.0
    assert policy._window_floor(None, np.zeros(0)) == 32.0
    assert TokenWindowPacing(min_active_requests=None)._window_floor(500.0, np.zeros(0)) == 32.0


def test_window_floor_holds_the_window_up_when_latency_soars():
    # On the steep profile (every request beyond the first adds l_min) sigma drives the target down; with the
    # floor the window never drops below 8 x the mean estimated remaining tokens (known lengths here).
    def run(min_active):
        policy = TokenWindowPacing(max_wait_steps=10**6, min_active_requests=min_active)
        env = make_env(policy, workload=backlog(), profile=flat_profile(alpha_s=0.043, saturation_batch=1),
                       engine={"length_mode": "known"})
        return drive(policy, env, 300)

    floored, free = run(8), run(None)
    assert np.all(floored["window"] >= floored["window_floor"])
    # The floor binds: the window sits on it at steps where the rule's target lies below it.
    binds = (floored["target"] < floored["window_floor"]) & np.isclose(floored["window"], floored["window_floor"])
    assert binds.sum() > 10
    assert floored["window_floor"].max() > 32.0  # the floor, not window_min, held the window
    assert np.all(free["window_floor"] == 32.0)


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
