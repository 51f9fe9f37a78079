"""One test per baseline, showing the rule that defines it (all driven through env.step)."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.engine.preemption import amin_estimate
from servegym.envs import ENGINE_INDEX, queue_matrix
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode
from tests.conftest import PAPER, fixed


def drive(name, workload, steps=100_000, seed=0, check=None, **env):
    policy = make_policy(name)
    env = make_env(policy, workload=workload, strict_actions=True, **env)
    obs, _ = env.reset(seed=seed)
    policy.reset()
    for _ in range(steps):
        action = policy.act(obs)
        if check is not None:
            check(obs, action, env)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    return env.unwrapped.cluster.log, policy


def crowded(n=60):
    # Requests with long known outputs on a small cache: admitting by prompt size alone overflows later.
    return fixed(np.zeros(n), np.full(n, 64), np.full(n, 300))


SMALL_KV = {"num_kv_blocks": 300, "block_size": 16, "length_mode": "known", "check_invariants": True}


@pytest.mark.parametrize("name", ["mc", "mc-sf", "clairvoyant-greedy"])
def test_future_memory_policies_never_overflow_where_fcfs_does(name):
    fcfs_log, _ = drive("fcfs", crowded(), engine=SMALL_KV)
    assert fcfs_log.num_preemptions.sum() > 0
    log, _ = drive(name, crowded(), engine=SMALL_KV)
    assert log.num_preemptions.sum() == 0
    assert log.counts()["num_finished"] == log.num_requests


def test_mc_sf_admits_shortest_predicted_first():
    workload = fixed(np.zeros(3), [10, 10, 10], [200, 5, 50])
    seen = []
    drive("mc-sf", workload, steps=1, engine={"length_mode": "known"},
          check=lambda obs, action, env: seen.append(action[:3].tolist()))
    assert seen[0] == [3, 1, 2]


def first_action(policy, workload, apply_overrides=True, **engine):
    env = make_env(policy, workload=workload, strict_actions=True, engine=engine, apply_overrides=apply_overrides)
    obs, _ = env.reset(seed=0)
    return policy.act(obs), env.unwrapped


def test_mc_sf_sorts_the_whole_queue_and_the_windowed_variant_only_its_head():
    # 40 requests wait at once: the 32 at the head will write 100 tokens, the 8 behind them 5. The paper's MC-SF
    # ranks the 8 short ones first (slots 32..39); sorting only the env's 32-request window never sees them.
    workload = fixed(np.zeros(40), np.full(40, 10), [100] * 32 + [5] * 8)
    whole, env = first_action(make_policy("mc-sf"), workload, length_mode="known")
    assert env.queue_window == 65_536 and whole[32:40].tolist() == list(range(1, 9))
    windowed, env = first_action(make_policy("mc-sf", window=32), workload, length_mode="known")
    assert env.queue_window == 32 and windowed.shape == (32,) and windowed[0] == 1
    locked, env = first_action(make_policy("mc-sf"), workload, apply_overrides=False, length_mode="known")
    assert env.queue_window == 32 and locked[0] == 1  # a locked env keeps its own window


@pytest.mark.parametrize(("bound", "mode", "admitted"), [
    # 20 prompts of 10 tokens, 1,000 KV tokens, unknown lengths shown as [1, 128]. All admitted together finish
    # together, so k of them peak at k (10 + R) tokens for an assumed output R: R = 128 (the shown upper end)
    # admits 7 (966 tokens), R = 60 (the workload's longest, the paper's bound) 14 (980).
    (0.0, "unknown", 7), (60.0, "unknown", 14), (128.0, "unknown", 7),
    # With known lengths (all 60) the bound is not used: 14 either way.
    (5.0, "known", 14), (0.0, "known", 14),
])
def test_mc_assumes_its_bound_for_an_unknown_output(bound, mode, admitted):
    workload = fixed(np.zeros(20), np.full(20, 10), np.full(20, 60))
    action, _ = first_action(make_policy("mc", unknown_output_bound=bound), workload, length_mode=mode,
                             max_tokens=128, num_kv_blocks=1000, block_size=1)
    assert int((action > 0).sum()) == admitted


def test_amin_estimate_doubles_from_the_lower_end():
    gen = np.array([0, 9, 10, 19, 20, 79, 80])
    assert amin_estimate(np.full(7, 10.0), np.full(7, 100.0), gen).tolist() == [10, 10, 20, 20, 40, 80, 100]


def test_amin_estimate_rises_when_a_request_outgrows_it():
    estimates, generated = [], []

    def record(obs, action, env):
        policy = record.policy
        if policy.running_estimates.size:
            estimates.append(float(policy.running_estimates[0]))
            generated.append(float(env.unwrapped.engine.running[0, 2]))

    policy = make_policy("amin")
    record.policy = policy
    env = make_env(policy, workload=fixed([0.0], [10], [100]), skip_idle=False,  # asked at every iteration
                   engine={"length_mode": "truth_interval", "prediction_error": 0.9})
    obs, _ = env.reset(seed=3)
    lo = env.unwrapped.cluster.log.output_lo[0]
    assert lo < 100
    done = False
    while not done:
        action = policy.act(obs)
        record(obs, action, env)
        obs, _, done, _, _ = env.step(action)
    estimates, generated = np.array(estimates), np.array(generated)
    assert estimates[0] == lo
    rises = np.flatnonzero(np.diff(estimates) > 0)
    assert rises.size >= 1
    assert np.all(generated[rises + 1] >= estimates[rises])  # it rose only once the request outgrew it
    assert np.all(generated < estimates)


def test_round_robin_policy_cycles_containers():
    n = 30
    log, _ = drive("round-robin", fixed(np.linspace(0, 3, n), np.full(n, 20), np.full(n, 10)),
                   pool={"num_containers": 3})
    assert log.container.tolist() == [0, 1, 2] * 10


def test_vllm_admits_nothing_in_a_step_after_a_preemption():
    steps_checked = []

    def check(obs, action, env):
        if obs["engine"][ENGINE_INDEX["last_num_preemptions"]] > 0:
            steps_checked.append(int(action.sum()))

    log, _ = drive("vllm", crowded(), engine=SMALL_KV, check=check)
    assert log.num_preemptions.sum() > 0 and steps_checked
    assert steps_checked == [0] * len(steps_checked)


def test_priority_admits_shortest_prompt_first():
    seen = []
    drive("priority", fixed(np.zeros(3), [500, 50, 200], [5, 5, 5]), steps=1,
          check=lambda obs, action, env: seen.append(action[:3].tolist()))
    assert seen[0] == [3, 1, 2]


def test_dynamic_batch_stops_growing_while_itl_is_above_target():
    violations = []

    def check(obs, action, env):
        if obs["engine"][ENGINE_INDEX["itl_smoothed_s"]] > 0.06 and action.any():
            violations.append(action)

    policy_params = {"itl_target_s": 0.06, "max_batch": 40}
    policy = make_policy("dynamic-batch", **policy_params)
    env = make_env(policy, workload="high", strict_actions=True, profile=PAPER)
    obs, _ = env.reset(seed=0)
    above = 0
    for _ in range(3000):
        action = policy.act(obs)
        check(obs, action, env)
        above += obs["engine"][ENGINE_INDEX["itl_smoothed_s"]] > 0.06
        assert obs["engine"][ENGINE_INDEX["num_running"]] <= 40
        obs, _, terminated, _, _ = env.step(action)
        if terminated:
            break
    assert above > 0 and not violations


def test_alpha_protection_respects_its_ceiling_and_clears_on_overflow():
    alpha = 0.2
    ceiling_ok, clears = [], []

    def check(obs, action, env):
        engine = env.unwrapped.engine
        need = np.ceil((queue_matrix(obs)[:, 0] + queue_matrix(obs)[:, 5] + 1) / 16)[action > 0].sum()
        if need:  # decoding may grow usage past the ceiling; admissions may not
            ceiling_ok.append(engine.num_used_blocks + need <= (1 - alpha) * engine.num_kv_blocks)

    def after(info, running_before):
        if info["num_preemptions"]:
            clears.append((info["num_preemptions"], running_before, info["num_running"]))

    policy = make_policy("alpha-protection", alpha=alpha)
    env = make_env(policy, workload=crowded(), engine={**SMALL_KV, "length_mode": "unknown"}, strict_actions=True,
                   skip_idle=False)  # each step one iteration: the check reads each preemption
    obs, _ = env.reset(seed=0)
    for _ in range(20_000):
        action = policy.act(obs)
        check(obs, action, env)
        running_before = env.unwrapped.engine.num_running + int(action.astype(bool).sum())
        obs, _, terminated, _, info = env.step(action)
        after(info, running_before)
        if terminated:
            break
    assert ceiling_ok and all(ceiling_ok)
    assert clears and all(preempted == before and running == 0 for preempted, before, running in clears)


def test_sarathi_keeps_every_step_within_its_token_budget():
    log, _ = drive("sarathi", "medium")
    steps = log.steps()
    decode, prefill = steps[:, 2], steps[:, 4]
    assert prefill.max() > 0
    assert np.all(prefill + decode <= 512 + steps[:, 3])  # first tokens of completed prefills ride along


def test_clairvoyant_greedy_sees_true_lengths():
    policy = make_policy("clairvoyant-greedy")
    env = make_env(policy, workload="low")
    env.reset(seed=0)
    log = env.unwrapped.cluster.log
    assert np.array_equal(log.output_lo, log.num_output_tokens) and np.array_equal(log.output_hi, log.num_output_tokens)


def test_serverless_llm_shortens_cold_starts():
    workload = fixed([0.0], [10], [3])
    cold = {"start_cold": True}
    fcfs = run_episode(make_env(make_policy("fcfs"), workload=workload, pool=cold, profile=PAPER), make_policy("fcfs"),
                       seed=0)
    sllm_policy = make_policy("serverless-llm")
    sllm = run_episode(make_env(sllm_policy, workload=workload, pool=cold, profile=PAPER), sllm_policy, seed=0)
    assert fcfs.log.load_wait_s[0] == pytest.approx(8.0)
    assert sllm.log.load_wait_s[0] == pytest.approx(0.8)
    assert sllm.summary["ttft_p50"] == pytest.approx(fcfs.summary["ttft_p50"] - 7.2)


def test_serverless_llm_routes_to_a_busy_container_that_holds_the_model():
    # Rule: an arrival goes to the least loaded container holding the model (warm or loading), a cold one only when
    # none does. Two cold containers: A (t = 0) starts container 0 loading and keeps it busy well past t = 3 s, so
    # B (t = 3) joins A there, warm, instead of the idle cold container 1 that least-loaded routing picks.
    log, _ = drive("serverless-llm", fixed([0.0, 3.0], [10, 10], [200, 3]), profile=PAPER,
                   pool={"num_containers": 2, "start_cold": True, "keep_alive_s": 60.0})
    assert log.container.tolist() == [0, 0]
    assert log.cold_start.tolist() == [True, False]
