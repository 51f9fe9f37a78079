"""Each policy's defining rule, tested where it differs from FCFS, with hand-computed expectations.

Some tests drive a policy through ``env.step``; others hand it a crafted observation (a real one from
``env.reset`` with chosen features and queue rows written in), which pins one decision exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.engine import LengthMode, State
from servegym.engine.log import STEP_INDEX
from servegym.envs import ENGINE_INDEX, QUEUE_FEATURES, queue_matrix, running_matrix
from servegym.policies import make_policy
from servegym.policies.base import output_estimate
from servegym.policies.flow_control import FlowControl
from servegym.policies.twp import TokenWindowPacing
from servegym.runner import make_env
from tests.conftest import fixed, flat_profile

L = 0.043  # flat_profile's step latency (s)


def reset_obs(policy, workload=None, **engine):
    env = make_env(policy, workload=workload or fixed([0.0], [10], [5]), profile=flat_profile(), engine=engine,
                   queue_window=8)
    obs, _ = env.reset(seed=0)
    return env, obs


def crafted(obs, queue=(), **features):
    """A copy of ``obs`` with the queue replaced by ``queue`` (dicts of QUEUE_FEATURES) and engine features set."""
    out = {k: v.copy() for k, v in obs.items()}
    rows = queue_matrix(out)
    rows[:] = 0.0
    for i, row in enumerate(queue):
        rows[i] = [row.get(name, 0.0) for name in QUEUE_FEATURES]
    out["engine"][ENGINE_INDEX["num_waiting"]] = len(queue)
    for name, value in features.items():
        out["engine"][ENGINE_INDEX[name]] = value
    return out


def steps_column(log, name):
    return log.steps()[:, STEP_INDEX[name]]


def drive(policy, env, limit=5000):
    obs, _ = env.reset(seed=0)
    policy.reset()
    first = None
    for _ in range(limit):
        action = policy.act(obs)
        first = action if first is None else first
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    return first, env.unwrapped.cluster.log


# ------------------------------------------------------------------------------------------------------ TWP
def test_twp_sigma_is_floored_at_one_half():
    # H0 = 400, gain 1 (the window jumps to its target), empty queue. An ITL of 0.2 l_min gives sigma = 0.2;
    # the target is H0 (1 + 0) / max(0.5, sigma) = 800, not 400 / 0.2 = 2000.
    policy = TokenWindowPacing(gain=1.0, window_max=10_000.0)
    _, obs = reset_obs(policy)
    policy.act(crafted(obs, itl_last_s=0.2 * L, baseline_step_s=L))
    d = policy.diagnostics()
    assert d["sigma"][0] == pytest.approx(0.2, rel=1e-6)
    assert d["target"][0] == pytest.approx(800.0, rel=1e-6)
    assert policy.window == pytest.approx(800.0, rel=1e-6)
    # Above the floor sigma counts in full: ITL 0.8 l_min -> 400 / 0.8 = 500.
    other = TokenWindowPacing(gain=1.0, window_max=10_000.0)
    other.act(crafted(obs, itl_last_s=0.8 * L, baseline_step_s=L))
    assert other.diagnostics()["target"][0] == pytest.approx(500.0, rel=1e-6)


def test_twp_smooths_itl_before_computing_sigma():
    # itl_filter 0.3: l_hat = 0.043 (first sample), then 0.043 + 0.3 (0.086 - 0.043) = 0.0559 -> sigma 1.3
    # (unsmoothed it would be 2.0). A step that decoded nothing (ITL 0) leaves l_hat alone.
    policy = TokenWindowPacing()
    _, obs = reset_obs(policy)
    for itl in (L, 2 * L, 0.0):
        policy.act(crafted(obs, itl_last_s=itl, baseline_step_s=L))
    assert policy.diagnostics()["sigma"] == pytest.approx([1.0, 1.3, 1.3], rel=1e-6)


def test_twp_window_moves_by_gain_toward_a_queue_capped_target():
    # sigma = 1 (no ITL yet). Queue depth 16 of Q = 32: target 400 (1 + 16/32) = 600, window 400 + 0.15 (200)
    # = 430. Depth 64: the queue term is capped at 1, target 800, window 430 + 0.15 (370) = 485.5.
    # The batch is full (num_running = max_num_seqs), so nothing is admitted from the zero queue rows. B0 = 8
    # given: the flat test profile's B0 (10^6) would hold the window at window_max.
    policy = TokenWindowPacing(min_active_requests=8)
    env, obs = reset_obs(policy)
    full = env.unwrapped.engine_config.max_num_seqs
    for depth in (16, 64):
        policy.act(crafted(obs, num_waiting=depth, num_running=full))
    d = policy.diagnostics()
    assert d["target"] == pytest.approx([600.0, 800.0])
    assert d["window"] == pytest.approx([430.0, 485.5])


def test_twp_kv_guard_tightens_at_once_and_relaxes_gradually():
    # kv_free_delta = -0.002: consumption 0.002, target min(0.3, 0.05 + 50 * 0.002) = 0.15, adopted at once.
    # Then delta 0: target 0.05, relax by 0.1 of the gap: 0.15 - 0.01 = 0.14, then 0.14 - 0.009 = 0.131.
    policy = TokenWindowPacing()
    _, obs = reset_obs(policy)
    for delta in (-0.002, 0.0, 0.0):
        policy.act(crafted(obs, kv_free_delta=delta))
    assert policy.diagnostics()["kv_guard"] == pytest.approx([0.15, 0.14, 0.131], rel=1e-5)


@pytest.mark.parametrize(("kv_guard", "expected"), [(0.05, [1, 0]), (0.0, [1, 2])])
def test_twp_kv_guard_blocks_an_admission_the_window_allows(kv_guard, expected):
    # 100 blocks of 16; window 10,000 tokens (never binding). A: prompt 1400, output 5 needs ceil(1401/16) = 88
    # blocks; B: prompt 150, output 10 needs ceil(151/16) = 10. A ranks first (balance exp(-5) > exp(-10)).
    # After A the free fraction would be 1 - 0.88 = 0.12 > 0.05: admitted. After B it would be 0.02 <= 0.05:
    # the guard stops B. With kv_guard = 0, 0.02 > 0 and B goes in too.
    policy = TokenWindowPacing(initial_window=10_000.0, window_max=10_000.0, kv_guard=kv_guard)
    _, obs = reset_obs(policy, fixed([0.0, 0.0], [1400, 150], [5, 10]), num_kv_blocks=100, block_size=16,
                       length_mode="known")
    assert policy.act(obs)[:2].tolist() == expected


def test_twp_forces_in_only_requests_waiting_more_than_t_max():
    # Window pinned at 32 tokens; both requests want 100 tokens, so only forcing admits. T_max = 20: the one
    # that waited 21 steps is forced in, the one that waited exactly 20 is not.
    policy = TokenWindowPacing(initial_window=32.0, window_min=32.0, window_max=32.0, max_wait_steps=20)
    _, obs = reset_obs(policy, length_mode="known")
    row = {"num_prompt_tokens": 10, "wait_s": 1.0, "output_lo": 100, "output_hi": 100}
    action = policy.act(crafted(obs, [{**row, "wait_steps": 20}, {**row, "wait_steps": 21}]))
    assert action[:2].tolist() == [0, 1]
    assert policy.forced_total == 1


def test_twp_floor_comes_from_the_running_requests_while_any_run():
    # B0 = 8, known lengths. Two running requests with 100 and 300 tokens left (mean 200): the floor is 1600.
    # The waiting request (50 tokens) sets it only while nothing runs: 8 x 50 = 400.
    policy = TokenWindowPacing(window_min=32.0, window_max=4096.0, min_active_requests=8)
    _, obs = reset_obs(policy, length_mode="known")
    waiting = [{"num_prompt_tokens": 10, "wait_s": 0.0, "output_lo": 50, "output_hi": 50}]
    busy = crafted(obs, waiting, num_running=2)
    rows = running_matrix(busy)
    rows[:] = 0.0
    rows[0] = [10, 10, 0, 100, 100, 0]
    rows[1] = [10, 10, 0, 300, 300, 0]
    policy.act(busy)
    policy.act(crafted(obs, waiting, num_running=0))
    assert policy.diagnostics()["window_floor"].tolist() == [1600.0, 400.0]


def test_twp_gate_stops_at_the_first_ranked_candidate_that_fails():
    # Window pinned at 100 tokens, known lengths, empty batch. X has waited 100 steps (starvation 100/200 puts
    # it first) and wants 150 tokens: 150 > 100 fails the gate. Y wants 20 and would pass, but the gate stops
    # at X: nothing is admitted.
    policy = TokenWindowPacing(initial_window=100.0, window_min=100.0, window_max=100.0)
    _, obs = reset_obs(policy, length_mode="known")
    x = {"num_prompt_tokens": 10, "wait_s": 1.0, "wait_steps": 100, "output_lo": 150, "output_hi": 150}
    y = {"num_prompt_tokens": 10, "wait_s": 0.0, "wait_steps": 0, "output_lo": 20, "output_hi": 20}
    assert policy.act(crafted(obs, [x, y]))[:2].tolist() == [0, 0]
    # With X gone, Y passes: 20 <= 100.
    assert policy.act(crafted(obs, [y]))[:1].tolist() == [1]


def test_fcfs_count_is_the_prefix_of_admission_blocks_that_fits_capped_at_free_slots():
    # fcfs_count counts row by row; the definition is the vectorised prefix sum. Random queues, budgets at and
    # around the cumulative block sums (the boundary is <=), slots that bind and slots that do not.
    from servegym.policies.common import admission_blocks, fcfs_count, free_slots, prefix_that_fits, visible_queue

    rng = np.random.default_rng(0)
    _, obs = reset_obs(make_policy("fcfs"))
    for _ in range(300):
        rows = [{"num_prompt_tokens": int(rng.integers(1, 200)), "num_generated": int(rng.choice([0, 0, 37]))}
                for _ in range(int(rng.integers(1, 9)))]
        crafted_obs = crafted(obs, rows, num_running=float(rng.integers(0, 130)))
        need = admission_blocks(crafted_obs, visible_queue(crafted_obs))
        budget = float(rng.choice(np.concatenate([np.cumsum(need), np.cumsum(need) - 0.5, [0.0, 1e9]])))
        expected = min(prefix_that_fits(need, budget), free_slots(crafted_obs))
        assert fcfs_count(crafted_obs, budget_blocks=budget) == expected


# ------------------------------------------------------------------------------------ memory-aware baselines
def brute_force_peak(current, remaining):
    """Largest total KV (tokens) over future steps t = 0, 1, ...: request j holds current[j] + t tokens while
    t <= remaining[j] (it finishes after its remaining[j]-th token)."""
    current, remaining = np.asarray(current, dtype=float), np.asarray(remaining, dtype=float)
    if current.size == 0:
        return 0.0
    return max(float(np.sum((current + t)[remaining >= t])) for t in range(int(remaining.max()) + 1))


def expected_prefix(current, remaining, capacity, block_size, slots):
    """Longest queue prefix whose peak plus one block of rounding slack per request fits ``capacity``."""
    count = 0
    for k in range(1, min(len(current), slots) + 1):
        if brute_force_peak(current[:k], remaining[:k]) + (block_size - 1) * k > capacity:
            break
        count = k
    return count


def test_the_feasible_prefix_is_the_brute_force_peak_check_with_requests_running():
    # Every prefix is judged at once in numpy (no binary search); here each answer is re-derived step by step from
    # the definition: running requests plus the first k candidates, their peak over every future step plus one
    # block of slack per request, within capacity_scale x the cache, at most the free slots.
    from servegym.envs.observation import RUNNING_INDEX
    from servegym.policies.common import free_slots, longest_feasible_prefix

    rng = np.random.default_rng(11)
    _, obs = reset_obs(make_policy("fcfs"))
    block = int(obs["engine"][ENGINE_INDEX["kv_block_size"]])
    checked = 0
    for _ in range(150):
        queue = [{"num_prompt_tokens": int(rng.integers(1, 120)), "num_generated": int(rng.choice([0, 0, 9]))}
                 for _ in range(int(rng.integers(1, 9)))]
        num_running = int(rng.integers(0, 6))
        case = crafted(obs, queue, num_running=float(num_running), kv_capacity_tokens=float(rng.integers(50, 900)))
        running = running_matrix(case)
        running[:] = 0.0
        running[:num_running, RUNNING_INDEX["num_prompt_tokens"]] = rng.integers(1, 100, num_running)
        running[:num_running, RUNNING_INDEX["num_generated"]] = rng.integers(0, 30, num_running)
        run_left = rng.integers(1, 40, num_running).astype(float)
        left = rng.integers(1, 40, len(queue)).astype(float)
        scale = float(rng.choice([0.5, 1.0, 1.3]))
        run_now = running[:num_running, RUNNING_INDEX["num_prompt_tokens"]] + \
            running[:num_running, RUNNING_INDEX["num_generated"]]
        now = np.array([q["num_prompt_tokens"] + q["num_generated"] for q in queue], dtype=float)
        capacity = scale * case["engine"][ENGINE_INDEX["kv_capacity_tokens"]]
        expected = 0
        for k in range(1, min(len(queue), free_slots(case)) + 1):
            peak = brute_force_peak(np.concatenate([run_now, now[:k]]), np.concatenate([run_left, left[:k]]))
            if peak + (block - 1) * (num_running + k) > capacity:
                break
            expected = k
        rows = queue_matrix(case)[: len(queue)]
        assert longest_feasible_prefix(case, run_left, rows, left, scale) == expected
        checked += 0 < expected < len(queue)
    assert checked > 20  # the cut falls inside the queue often, not only at its ends


@pytest.mark.parametrize("name", ["mc", "mc-sf"])
def test_unknown_lengths_are_planned_at_their_upper_bound(name):
    # Unknown lengths: each request shows [1, max_tokens = 100]. 20 blocks of 16 = 320 tokens. Five 10-token
    # prompts: at the upper bound each peaks at 10 + 100 = 110 tokens, plus 15 of block slack = 125, so two fit
    # (250) and three do not (375). At the lower bound (1 token) all five would look feasible (5 * 26 = 130).
    # While two run, a third never fits: a running request's prompt + generated + (hi - generated) stays 110.
    # (Their true outputs are 10 tokens, so they finish and the rest follow.)
    policy = make_policy(name)
    env = make_env(policy, workload=fixed(np.zeros(5), np.full(5, 10), np.full(5, 10)), profile=flat_profile(),
                   engine={"length_mode": "unknown", "max_tokens": 100, "num_kv_blocks": 20, "block_size": 16})
    first, log = drive(policy, env)
    assert np.flatnonzero(first).tolist() == [0, 1]
    assert steps_column(log, "num_running").max() == 2
    assert log.counts()["num_finished"] == 5


def test_mc_plans_predicted_lengths_at_their_upper_bound():
    # Truth intervals (seeded) around true outputs of 40 tokens; 20 blocks of 16. The expected first
    # admission count is the definition evaluated by brute force on the observed upper bounds.
    policy = make_policy("mc")
    env = make_env(policy, workload=fixed(np.zeros(6), np.full(6, 10), np.full(6, 40)), profile=flat_profile(),
                   engine={"length_mode": "truth_interval", "prediction_error": 0.9, "num_kv_blocks": 20,
                           "block_size": 16})
    obs, _ = env.reset(seed=0)
    log = env.unwrapped.cluster.log
    current = np.full(6, 10)
    at_hi = expected_prefix(current, log.output_hi, 320, 16, 128)
    at_lo = expected_prefix(current, log.output_lo, 320, 16, 128)
    assert at_hi < at_lo  # the seed makes the two bounds disagree, so the test can tell them apart
    assert np.count_nonzero(policy.act(obs)) == at_hi
    _, log = drive(policy, env)
    assert log.num_preemptions.sum() == 0 and log.counts()["num_finished"] == 6


def test_mc_keeps_one_block_of_slack_per_request():
    # Known lengths, 20 blocks of 16 = 320 tokens. Three requests of 10 + 90 = 100 tokens: by tokens alone three
    # fit (300 <= 320), but each needs ceil(100/16) = 7 blocks at its end, 21 > 20. With 15 tokens of slack
    # each, 3 * 115 = 345 > 320: MC admits two (230), and nothing is ever preempted.
    assert 3 * math.ceil(100 / 16) > 20
    policy = make_policy("mc")
    env = make_env(policy, workload=fixed(np.zeros(3), np.full(3, 10), np.full(3, 90)), profile=flat_profile(),
                   engine={"length_mode": "known", "num_kv_blocks": 20, "block_size": 16})
    first, log = drive(policy, env)
    assert np.count_nonzero(first) == 2
    assert log.num_preemptions.sum() == 0 and log.counts()["num_finished"] == 3


def test_mc_sf_sorts_by_the_predicted_midpoint_and_plans_at_the_upper_bound():
    # Predicted mode, 10 blocks of 16 = 160 tokens, 10-token prompts. A shows [10, 200] (midpoint 105), B shows
    # [50, 60] (midpoint 55): B goes first. B alone peaks at 10 + 60 = 70, + 15 slack = 85 <= 160. With A after
    # it the peak is A's 10 + 200 = 210 at t = 200, + 30 slack = 240 > 160: only B is admitted.
    # (Sorting by the lower bound would put A first and admit nothing; planning at the lower bounds would admit
    # both: peak 40 at t = 10, 60 at t = 50, + 30 = 90.)
    policy = make_policy("mc-sf")
    _, obs = reset_obs(policy, num_kv_blocks=10, block_size=16, length_mode="predicted")
    a = {"num_prompt_tokens": 10, "output_lo": 10, "output_hi": 200}
    b = {"num_prompt_tokens": 10, "output_lo": 50, "output_hi": 60}
    assert policy.act(crafted(obs, [a, b]))[:2].tolist() == [0, 1]


def test_clairvoyant_greedy_packs_shortest_remaining_first():
    # Known lengths, 15 blocks of 16 = 240 tokens, 10-token prompts, outputs 200, 5, 50 in queue order.
    # Shortest first: 5 (peak 15 + 15 slack), then 50 (peak max(30, 60) + 30 = 90), then 200 would make the
    # peak 210 + 45 = 255 > 240. So slot 1 gets rank 1, slot 2 rank 2, slot 0 waits.
    # (Longest first would admit 200 (225) and 50 (210 + 30 = 240): ranks [1, 0, 2].)
    policy = make_policy("clairvoyant-greedy")
    env = make_env(policy, workload=fixed(np.zeros(3), np.full(3, 10), [200, 5, 50]), profile=flat_profile(),
                   engine={"num_kv_blocks": 15, "block_size": 16})
    first, log = drive(policy, env)
    assert first[:3].tolist() == [0, 1, 2]
    assert log.num_preemptions.sum() == 0 and log.counts()["num_finished"] == 3


# ------------------------------------------------------------------------------------------- flow control
@pytest.mark.parametrize(("b", "expected"), [
    # Credits accrue b per step, whole credits are spent, the fraction carries:
    (0.1, [0] * 9 + [1]),                       # 0.1 x 10 = 1.0 (summed in floats: 0.9999999999999999)
    (0.3, [0, 0, 0, 1, 0, 0, 1, 0, 0, 1]),      # 0.3 .6 .9 1.2|.2 .5 .8 1.1|.1 .4 .7 1.0
    (1.5, [1, 2] * 5),                          # 1.5|.5 2.0|0 ...
    (2.5, [2, 3] * 5),
    (7.3, [7, 7, 7, 8, 7, 7, 8, 7, 7, 8]),      # 7.3 7.6 7.9 8.2|.2 7.5 7.8 8.1|.1 7.4 7.7 8.0
])
def test_flow_control_admits_the_token_bucket_sequence(b, expected):
    policy = FlowControl(activation_budget=b)
    env = make_env(policy, workload=fixed(np.zeros(100), np.full(100, 4), np.full(100, 50)),
                   profile=flat_profile(num_kv_blocks=200_000, block_size=1))
    obs, _ = env.reset(seed=0)
    admitted = []
    for _ in range(10):
        obs, _, _, _, info = env.step(policy.act(obs))
        admitted.append(info["num_admitted"])
    assert admitted == expected


@pytest.mark.parametrize("asked", [None, "fewest_generated", "clear_all"])
def test_flow_control_evicts_the_newest_even_when_it_generated_most(asked):
    # b = 1, chunks of 16, 8 blocks of 16. Request 0 (64-token prompt) is admitted at step 0 and prefills over
    # steps 0-3; request 1 (8-token prompt) is admitted at step 1 and decodes from then on. After step s >= 3,
    # request 0 has generated s - 2 tokens and holds 62 + s KV tokens; request 1 has s tokens and 8 + s KV.
    # At step 25 request 1 would go from 32 to 33 tokens (a 3rd block) while request 0 holds ceil(86/16) = 6:
    # 9 > 8 blocks. LIFO evicts request 1, the newest, although it has generated more (24 vs 22); the
    # fewest-generated rule would have evicted request 0. The policy's LIFO wins over the env's setting.
    policy = FlowControl(activation_budget=1.0)
    engine = {"num_kv_blocks": 8, "block_size": 16, "prefill_chunk_tokens": 16}
    if asked is not None:
        engine["preemption"] = asked
    env = make_env(policy, workload=fixed([0.0, 0.0], [64, 8], [50, 50]), profile=flat_profile(), engine=engine)
    assert env.unwrapped.engine_config.preemption == "lifo"
    obs, _ = env.reset(seed=0)
    log = env.unwrapped.cluster.log
    preempted_at = None
    for step in range(26):
        generated = env.unwrapped.engine.running[:, 2].tolist()
        obs, _, _, _, info = env.step(policy.act(obs))
        if info["num_preemptions"]:
            preempted_at = step
            break
    assert preempted_at == 25 and info["num_preemptions"] == 1
    assert generated == [22, 24]
    assert log.state[1] == State.PREEMPTED and log.state[0] == State.DECODING
    assert log.num_generated_at_preemption[1] == 24


def test_output_estimate_per_length_mode_on_an_asymmetric_interval():
    # Intervals [5, 10], [1, 3] and [2, 400]: known reads lo (the engine sets lo = hi = truth), predicted and
    # truth_interval the midpoint, unknown the prior clipped into each interval (4 -> 5, 3, 4), or hi without one.
    lo, hi = np.array([5.0, 1.0, 2.0], dtype=np.float32), np.array([10.0, 3.0, 400.0], dtype=np.float32)
    assert output_estimate(lo, hi, LengthMode.KNOWN, 4.0).tolist() == [5.0, 1.0, 2.0]
    assert output_estimate(lo, hi, LengthMode.PREDICTED, 4.0).tolist() == [7.5, 2.0, 201.0]
    assert output_estimate(lo, hi, LengthMode.TRUTH_INTERVAL, 4.0).tolist() == [7.5, 2.0, 201.0]
    unknown = output_estimate(lo, hi, LengthMode.UNKNOWN, 4.0)
    assert unknown.tolist() == [5.0, 3.0, 4.0] and unknown.dtype == np.float64
    assert output_estimate(lo, hi, LengthMode.UNKNOWN, None).tolist() == [10.0, 3.0, 400.0]
