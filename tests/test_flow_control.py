"""Flow control: the activation budget, LIFO eviction, and the stability analysis against simulation."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from servegym.engine import EngineConfig
from servegym.metrics import queue_growth_slope
from servegym.policies import make_policy
from servegym.policies.flow_control import FlowControl
from servegym.runner import make_env, run_episode
from servegym.stability import analyse, necessary_condition, suggest_budget, token_steps, workload_stability
from servegym.workloads import Choice, Poisson, SyntheticWorkload, make_workload
from tests.conftest import fixed, flat_profile


def test_never_more_than_b_activations_per_step_over_fuzzed_steps():
    rng = np.random.default_rng(5)
    steps = 0
    while steps < 10_000:
        b = float(rng.choice([0.25, 0.5, 1.0, 2.0, 3.0, 1.5]))
        policy = FlowControl(activation_budget=b)
        workload = SyntheticWorkload(Poisson(float(rng.uniform(5, 60))), 30.0,
                                     prompt=Choice((20, 200, 800), (0.5, 0.3, 0.2)), output=Choice((5, 50), (0.5, 0.5)))
        env = make_env(policy, workload=workload, strict_actions=True,
                       engine={"num_kv_blocks": int(rng.integers(200, 2000)), "check_invariants": True})
        obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
        policy.reset()
        admitted = []
        for _ in range(1000):
            obs, _, terminated, truncated, info = env.step(policy.act(obs))
            admitted.append(info["num_admitted"])
            if terminated or truncated:
                break
        admitted = np.asarray(admitted)
        steps += admitted.size
        assert admitted.max() <= math.ceil(b)
        # A fractional budget is a rate: no window of k steps activates more than b*k + 1.
        window = max(1, round(4 / b))
        sums = np.convolve(admitted, np.ones(window, dtype=int), mode="valid")
        assert sums.max() <= b * window + 1


def test_fractional_budget_activates_one_every_1_over_b_steps():
    policy = FlowControl(activation_budget=0.25)
    env = make_env(policy, workload=fixed(np.zeros(50), np.full(50, 10), np.full(50, 500)))
    obs, _ = env.reset(seed=0)
    admitted = []
    for _ in range(40):
        obs, _, _, _, info = env.step(policy.act(obs))
        admitted.append(info["num_admitted"])
    assert admitted == [0, 0, 0, 1] * 10


@pytest.mark.parametrize("b", ["0.25", "0.3", "1", "1.5", "2.5", "2.8", "7.3"])
def test_every_window_of_n_saturated_steps_admits_floor_or_ceil_of_n_b(b):
    # 9,000 short requests wait from t=0 in a cache that holds them all: the queue never empties and always
    # fits, so the budget alone decides. Every window of n steps (n = 1..1000) must admit floor(n b) or
    # ceil(n b); the old bucket capped at max(b, 1) admitted 1 per step for b = 1.5 and 2 for b = 2.8.
    n_steps, n_requests = 1000, 9000
    policy = FlowControl(activation_budget=float(b))
    env = make_env(policy, workload=fixed(np.zeros(n_requests), np.full(n_requests, 4), np.full(n_requests, 3)),
                   profile=flat_profile(num_kv_blocks=200_000, block_size=1), engine={"max_num_seqs": 512},
                   max_episode_steps=n_steps + 1)
    obs, _ = env.reset(seed=0)
    admitted = []
    for _ in range(n_steps):
        obs, _, _, _, info = env.step(policy.act(obs))
        admitted.append(info["num_admitted"])
    assert sum(admitted) == math.floor(Fraction(b) * n_steps)  # the bucket starts empty
    totals = np.concatenate([[0], np.cumsum(admitted)])
    for n in range(1, n_steps + 1):
        window = totals[n:] - totals[:-n]
        lo, hi = math.floor(Fraction(b) * n), math.ceil(Fraction(b) * n)
        assert window.min() >= lo and window.max() <= hi, (n, window.min(), window.max(), lo, hi)


def test_unused_whole_credits_lapse_so_a_blocked_spell_banks_no_burst():
    # b = 1.5, 120 one-token blocks. Request 0 (114 prompt + 6 output tokens) fills the cache, so the ten
    # 10-token prompts behind it cannot fit for several steps. When it finishes they all fit at once, and the
    # first step admits at most ceil(b) = 2, not the credits a plain accumulator would have banked meanwhile.
    policy = FlowControl(activation_budget=1.5)
    env = make_env(policy, workload=fixed(np.zeros(11), [114] + [10] * 10, [6] + [20] * 10),
                   profile=flat_profile(num_kv_blocks=120, block_size=1))
    obs, _ = env.reset(seed=0)
    admitted = []
    for _ in range(12):
        obs, _, _, _, info = env.step(policy.act(obs))
        admitted.append(info["num_admitted"])
    assert admitted[0] == 1
    resumed = next(i for i in range(1, len(admitted)) if admitted[i])
    assert resumed >= 5, admitted  # blocked while request 0 decodes
    assert admitted[resumed] <= 2 and sum(admitted[resumed:resumed + 2]) == 3, admitted


def test_evictions_are_lifo():
    # One activation per step; 8 requests of 16-token prompts grow until 30 blocks overflow.
    policy = FlowControl(activation_budget=1.0)
    env = make_env(policy, workload=fixed(np.zeros(8), np.full(8, 16), np.full(8, 200)),
                   engine={"num_kv_blocks": 30, "block_size": 16})
    obs, _ = env.reset(seed=0)
    engine = env.unwrapped.engine
    victims = []
    for _ in range(300):
        active = engine.running_ids.tolist()
        obs, _, terminated, _, info = env.step(policy.act(obs))
        if info["num_preemptions"]:
            evicted = [r for r in active if r in engine.waiting.tolist()]
            assert len(evicted) == info["num_preemptions"]
            # The evicted requests are the most recently activated ones, newest first.
            assert evicted == active[len(active) - len(evicted):]
            victims.extend(evicted)
        if terminated:
            break
    assert victims, "the cache never overflowed"


def constant_latency_env(policy, rate_per_step, n_steps, kv_tokens):
    step = 0.043
    workload = SyntheticWorkload(Poisson(rate_per_step / step), n_steps * step,
                                 prompt=Choice((10,), (1.0,)), output=Choice((40,), (1.0,)))
    return make_env(policy, workload=workload, profile=flat_profile(num_kv_blocks=kv_tokens, block_size=1),
                    engine={"max_num_seqs": 512, "max_num_batched_tokens": 4096}, max_episode_steps=n_steps)


def test_stability_analysis_agrees_with_simulation():
    kv = 4000
    per_request = token_steps(np.array([10]), np.array([40]))
    assert per_request == 10 * 40 + (40 + 1600) / 2
    critical = kv / per_request  # arrivals per step at the necessary bound
    assert necessary_condition(0.99 * critical, per_request, kv) and not necessary_condition(1.01 * critical,
                                                                                                 per_request, kv)
    b = suggest_budget(per_request, kv, eps=0.1)

    # 20% above the bound: even with an unlimited budget no policy keeps up; the queue grows linearly.
    over = FlowControl(activation_budget=50.0)
    result = run_episode(constant_latency_env(over, 1.2 * critical, 3000, kv), over, seed=0)
    steps = result.log.steps()
    waiting = steps[:, 6]
    slope_per_step = np.polyfit(np.arange(waiting.size), waiting, 1)[0]
    assert slope_per_step > 0.3 * 0.2 * critical
    assert waiting[-500:].mean() > 2 * waiting[1000:1500].mean() > 0

    # 50% below the bound with the suggested b: the queue stays bounded.
    under = FlowControl(activation_budget=b)
    result = run_episode(constant_latency_env(under, 0.5 * critical, 3000, kv), under, seed=0)
    waiting = result.log.steps()[:, 6]
    assert waiting.max() < 20
    assert abs(queue_growth_slope(result.log)) < 0.05


def test_stability_report_for_a_named_workload(capsys):
    from servegym.backends import load_profile

    report = workload_stability(make_workload("burst"), load_profile("paper-v100-llama3.2-3b"), EngineConfig())
    assert report.necessary_ok and 0 < report.load_ratio < 1
    assert report.suggested_budget == pytest.approx(0.9 * report.kv_tokens / report.mean_token_steps)
    with pytest.raises(ValueError, match="eps"):
        analyse(np.array([1]), np.array([1]), 1.0, 10, load_profile("paper-v100-llama3.2-3b").latency, 8, eps=1.5)


def test_cli_reports_stability(capsys):
    from servegym.cli import main

    assert main(["stability", "--workload", "high"]) == 0
    out = capsys.readouterr().out
    assert "load ratio" in out and "suggested b" in out


@pytest.mark.parametrize("length_mode", ["known", "unknown"])
def test_flow_control_runs_with_known_and_unknown_lengths(length_mode):
    policy = make_policy("flow-control", activation_budget=2.0)
    env = make_env(policy, workload="medium", engine={"length_mode": length_mode})
    result = run_episode(env, policy, seed=1)
    assert result.summary["num_finished"] == result.summary["num_requests"]


def test_per_class_budgets_admit_each_class_at_its_own_rate_with_known_lengths():
    # Requests alternate between outputs 20 and 60, all waiting at t=0 in a roomy cache. Class 20 gets b = 1,
    # class 60 gets b = 0.25: over 40 steps class 20 admits 40 and class 60 admits 10, each FIFO within its class,
    # although a single FIFO bucket would have taken them in arrival order.
    n = 200
    outputs = np.where(np.arange(n) % 2 == 0, 20, 60)
    policy = FlowControl(activation_budget=5.0, class_budgets=[[20, 1.0], [60, 0.25]])
    env = make_env(policy, workload=fixed(np.zeros(n), np.full(n, 4), outputs), engine={"length_mode": "known"},
                   profile=flat_profile(num_kv_blocks=100_000, block_size=1))
    obs, _ = env.reset(seed=0)
    for _ in range(40):
        obs, *_ = env.step(policy.act(obs))
    log = env.unwrapped.cluster.log
    admitted = ~np.isnan(log.admit_s)
    assert admitted[outputs == 20].sum() == 40 and admitted[outputs == 60].sum() == 10
    assert np.flatnonzero(admitted & (outputs == 60)).tolist() == list(range(1, 20, 2))  # FIFO within the class


def test_per_class_budgets_fall_back_to_one_bucket_when_lengths_are_hidden():
    n = 60
    policy = FlowControl(activation_budget=1.5, class_budgets=[[20, 5.0]])
    env = make_env(policy, workload=fixed(np.zeros(n), np.full(n, 4), np.full(n, 20)),
                   profile=flat_profile(num_kv_blocks=100_000, block_size=1))  # unknown lengths (the default)
    obs, _ = env.reset(seed=0)
    for _ in range(10):
        obs, *_ = env.step(policy.act(obs))
    assert np.count_nonzero(~np.isnan(env.unwrapped.cluster.log.admit_s)) == 15


@pytest.mark.parametrize("bad", [[[20]], [[20, 0.0]], [[0, 1.0]], [[20, 1.0], [20, 2.0]], "x"])
def test_class_budgets_are_validated(bad):
    with pytest.raises(ValueError, match="class_budgets"):
        FlowControl(class_budgets=bad)


def test_class_budgets_meet_the_sufficient_condition_by_hand():
    # Classes (l, o) = (10, 20), (10, 40), (10, 60): c = 10 o + (o + o^2)/2 = 410, 1220, 2430. Shares 1:1:2
    # (weights 0.25, 0.25, 0.5) give E[c] = 102.5 + 305 + 1215 = 1622.5; with M = 4096 and eps = 0.1 the
    # total budget is 0.9 x 4096 / 1622.5 = 2.27205 activations per step, split 0.25 / 0.25 / 0.5.
    from servegym.stability import class_budgets

    budgets = class_budgets([10, 10, 10], [20, 40, 60], [1, 1, 2], 4096, 0.1)
    total = 0.9 * 4096 / 1622.5
    assert [k for k, _ in budgets] == [20, 40, 60]
    assert [b for _, b in budgets] == pytest.approx([0.25 * total, 0.25 * total, 0.5 * total])
    assert sum(b * c for (_, b), c in zip(budgets, (410, 1220, 2430), strict=True)) == pytest.approx(0.9 * 4096)
