"""Benchmark tasks: registry, seed split, censored metrics, reward identities, the idle guard, mixtures."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from servegym import ENV_ID
from servegym.engine import State
from servegym.envs import TASKS, TEST_SEEDS, TRAIN_SEEDS, VALIDATION_SEEDS, MixtureEnv, ServingEnv
from servegym.metrics import censored_latency, summarize
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode, serving_env


def _run(env, policy_name="fcfs", seed=0, action=None):
    """Step to the end; return (sum of rewards, rewards, infos)."""
    policy = make_policy(policy_name)
    obs, _ = env.reset(seed=seed)
    policy.reset()
    rewards, infos, done = [], [], False
    while not done:
        act = policy.act(obs) if action is None else action
        obs, reward, terminated, truncated, info = env.step(act)
        rewards.append(reward)
        infos.append(info)
        done = terminated or truncated
    return float(np.sum(rewards)), rewards, infos


def test_seed_sets_are_disjoint_and_frozen():
    train = set(TRAIN_SEEDS)
    assert not train & set(VALIDATION_SEEDS) and not train & set(TEST_SEEDS)
    assert not set(VALIDATION_SEEDS) & set(TEST_SEEDS)
    assert tuple(range(900_000, 900_030)) == TEST_SEEDS  # frozen: changing it invalidates every leaderboard


def test_train_seed_wrapper_cycles_inside_the_training_range():
    pytest.importorskip("stable_baselines3")
    from servegym.rl.wrappers import TrainSeeds

    env = TrainSeeds(gym.make(ENV_ID, workload="low", max_steps=5), start=99_998, stride=3)
    seen = []
    for _ in range(3):
        env.reset()
        seen.append(env.last_seed)
    assert seen == [99_998, 1, 4]  # folded back into [0, 100000), never into validation or test seeds
    with pytest.raises(ValueError, match="outside TRAIN_SEEDS"):
        env.reset(seed=TEST_SEEDS[0])


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_builds_and_runs_a_few_steps(name):
    env = gym.make(ENV_ID, task=name)
    obs, _ = env.reset(seed=TEST_SEEDS[0])
    assert env.observation_space.contains(obs)
    for _ in range(5):
        obs, reward, *_ = env.step(env.action_space.sample() * 0)
        assert np.isfinite(reward)


def test_task_settings_reach_the_env_and_overrides_win():
    env = gym.make(ENV_ID, task="long-context", engine={"max_num_seqs": 64})
    inner = env.unwrapped
    assert inner.engine.num_kv_blocks == 2048 and inner.engine_config.max_num_seqs == 64
    assert inner.engine_config.length_mode.value == "predicted"
    pool = gym.make(ENV_ID, task="serverless-burst").unwrapped
    assert pool.pool_config.num_containers == 4 and pool.pool_config.start_cold
    assert gym.make(ENV_ID, task="slo-goodput").unwrapped.reward_name == "slo_goodput"
    with pytest.raises(ValueError, match="unknown task"):
        gym.make(ENV_ID, task="nope")


def test_censored_latency_counts_the_unfinished_up_to_the_end():
    env = gym.make(ENV_ID, workload="high", max_steps=300)
    _run(env)
    log = serving_env(env).cluster.log
    end = max(rows[-1][0] for rows in log.step_rows if rows)
    waiting = (log.state == State.WAITING) | (log.state == State.DECODING) | (log.state == State.PREFILLING)
    assert waiting.any()  # truncated mid-episode: some requests are unfinished
    by_hand = np.concatenate([log.finish_s[log.state == State.FINISHED] - log.arrival_s[log.state == State.FINISHED],
                              end - log.arrival_s[waiting | (log.state == State.PREEMPTED)]])
    assert np.isclose(censored_latency(log).sum(), by_hand.sum())
    s = summarize(log)
    assert s["e2e_mean_all_s"] > s["e2e_mean"]  # the finished-only mean flatters a truncated episode


def test_latency_reward_sums_to_minus_censored_latency_and_the_truncation_penalty():
    for penalty in (0.0, 7.5):
        env = gym.make(ENV_ID, workload="high", max_steps=400, truncation_penalty_s=penalty)
        total, _, _ = _run(env)
        inner = serving_env(env)
        s = summarize(inner.cluster.log)
        unserved = s["num_requests"] - s["num_finished"] - s["num_rejected"]
        assert unserved > 0
        assert np.isclose(total, -s["e2e_mean_all_s"] * (s["num_arrived"] - s["num_rejected"]) - penalty * unserved,
                          rtol=1e-9)


def test_a_terminated_episode_pays_no_penalty():
    env = gym.make(ENV_ID, workload="low", max_steps=10**6, truncation_penalty_s=1e6)
    total, _, _ = _run(env)
    s = summarize(serving_env(env).cluster.log)
    assert s["num_unfinished"] == 0
    assert np.isclose(total, -s["e2e_mean_all_s"] * s["num_arrived"], rtol=1e-9)


def test_slo_goodput_reward_sums_to_the_good_request_count():
    env = gym.make(ENV_ID, task="slo-goodput", max_steps=1500)
    total, rewards, infos = _run(env)
    s = summarize(serving_env(env).cluster.log)
    assert total == pytest.approx(s["goodput_rps"] * s["makespan_s"]) and total == infos[-1]["num_slo_good"]
    assert 0 < total < s["num_finished"]  # overloaded: some finish late, so the SLO filter bites
    assert all(r == int(r) >= 0 for r in rewards)


def test_time_discount_weights_each_step_by_its_start_time():
    plain = gym.make(ENV_ID, workload="medium", max_steps=200)
    discounted = gym.make(ENV_ID, workload="medium", max_steps=200, reward_half_life_s=3.0)
    _, raw, infos = _run(plain)
    _, disc, _ = _run(discounted)
    start = np.array([i["clock_s"] - i["step_s"] for i in infos]) - serving_env(plain).cluster.log.arrival_s[0]
    assert np.allclose(disc, np.array(raw) * 2.0 ** (-start / 3.0))
    assert abs(disc[-1]) < abs(raw[-1])


def test_a_stalling_policy_is_warned_about_once():
    env = gym.make(ENV_ID, workload="medium", max_steps=250)
    with pytest.warns(RuntimeWarning, match="not admitting") as record:
        _, _, infos = _run(env, action=np.zeros(32, dtype=np.int64))
    assert len([w for w in record if "not admitting" in str(w.message)]) == 1
    assert infos[-1]["num_stalled_steps"] == 250


def test_idle_guard_truncates_a_starving_agent_with_the_documented_penalty():
    env = gym.make(ENV_ID, workload="medium", idle_guard_steps=30, truncation_penalty_s=10.0)
    total, rewards, infos = _run(env, action=np.zeros(32, dtype=np.int64))
    inner = serving_env(env)
    assert len(rewards) == 30 and infos[-1]["idle_guard"] and infos[-1]["num_stalled_steps"] == 30
    log = inner.cluster.log
    unserved = log.num_requests  # nothing finished, nothing rejected
    censored = censored_latency(log).sum()
    assert np.isclose(total, -censored - 10.0 * unserved)
    # FCFS never stalls, so the guard never fires on it
    _, _, fcfs_infos = _run(gym.make(ENV_ID, workload="medium", idle_guard_steps=30))
    assert max(i["num_stalled_steps"] for i in fcfs_infos) == 0


@pytest.mark.filterwarnings("ignore:requests have waited")
@pytest.mark.parametrize("guard", [200, None])
def test_starving_ranks_below_fcfs_with_or_without_the_guard(guard):
    def score(action=None):
        env = gym.make(ENV_ID, task="memory-tight", max_steps=400, idle_guard_steps=guard)
        total, _, _ = _run(env, action=action)
        return total, summarize(serving_env(env).cluster.log)

    fcfs_return, _ = score()
    starve_return, starve = score(np.zeros(32, dtype=np.int64))
    assert starve_return < fcfs_return  # both truncated at 400 steps; starving pays the penalty for every request
    assert starve_return <= -60.0 * starve["num_requests"]
    assert np.isnan(starve["e2e_mean"])  # the finished-only mean has nothing to say
    assert starve["num_unfinished"] > 0 and starve["num_finished"] == 0


def test_mixture_draws_components_from_the_seed():
    env = gym.make(ENV_ID, task="mixture")
    assert isinstance(env.unwrapped, MixtureEnv)
    drawn = {}
    for seed in range(12):
        _, info = env.reset(seed=seed)
        drawn[seed] = info["task"]
        assert isinstance(serving_env(env), ServingEnv)
    assert set(drawn.values()) == set(TASKS["mixture"].components)
    obs_a, info_a = env.reset(seed=5)
    obs_b, info_b = env.reset(seed=5)
    assert info_a["task"] == info_b["task"] == drawn[5]
    assert all(np.array_equal(obs_a[k], obs_b[k]) for k in obs_a)


def test_mixture_episode_runs_with_a_policy_and_names_its_task():
    policy = make_policy("fcfs")
    env = make_env(policy, task="mixture", max_steps=50)
    result = run_episode(env, policy, seed=TEST_SEEDS[0])
    assert result.steps <= 50 and result.summary["num_arrived"] > 0


def test_module_prefix_makes_the_env_without_importing_servegym():
    code = ("import gymnasium as gym, sys; env = gym.make('servegym:servegym/Serving-v2', task='relaxed'); "
            "env.reset(seed=0); print(type(env.unwrapped).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ServingEnv"


@pytest.mark.parametrize("task", ["memory-tight", "serverless-burst"])
def test_decision_steps_skip_idle_iterations_and_keep_the_reward_sum(task):
    """FCFS admits nothing where no decision is possible, so both modes run the same episode: the same finish
    times and the same return, in fewer agent steps."""
    def episode(decision_steps):
        env = gym.make(ENV_ID, task=task, max_steps=4000, decision_steps=decision_steps)
        total, rewards, infos = _run(env)
        log = serving_env(env).cluster.log
        return total, len(rewards), infos, log

    total, steps, _, log = episode(False)
    d_total, d_steps, d_infos, d_log = episode(True)
    np.testing.assert_array_equal(np.nan_to_num(d_log.finish_s), np.nan_to_num(log.finish_s))
    assert np.isclose(d_total, total, rtol=1e-12)
    assert d_steps < steps and sum(i["num_iterations"] for i in d_infos) == steps
    assert sum(i["num_arrived"] for i in d_infos) == log.counts()["num_arrived"] - _initial_arrivals(task)


def _initial_arrivals(task):
    env = gym.make(ENV_ID, task=task)
    _, info = env.reset(seed=0)
    return info["num_arrived"]


def test_decision_steps_return_only_where_an_admission_is_possible():
    env = gym.make(ENV_ID, task="memory-tight", decision_steps=True)
    obs, _ = env.reset(seed=0)
    inner = serving_env(env)
    for _ in range(300):
        obs, _, terminated, truncated, _ = env.step(make_policy("fcfs").act(obs))
        if terminated or truncated:
            break
        e = inner.engine
        assert e.waiting.size and e.num_running < inner.engine_config.max_num_seqs
        assert e.num_used_blocks < e.num_kv_blocks


def test_tasks_command_lists_every_task_with_its_headroom(tmp_path, capsys):
    from servegym.benchmark.bench import BenchRow, write_leaderboard
    from servegym.cli import main

    rows = [BenchRow("memory-tight", policy, seed, value, 1.0, 1.0, 1.0, 0, False, 10)
            for seed in (1, 2, 3) for policy, value in (("random", -100.0 - seed), ("fcfs", -90.0 - seed),
                                                     ("mc-sf", -50.0 - seed), ("clairvoyant-greedy", -60.0 - seed))]
    csv_path, _ = write_leaderboard(rows, tmp_path)
    assert main(["tasks", "--leaderboard", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in TASKS)
    assert "best policy `mc-sf`" in out and "decision-sensitive" in out
    assert "test 900000-900029" in out


def test_slo_goodput_counts_only_requests_within_both_slos():
    from servegym.engine import EpisodeLog
    from servegym.metrics import met_slo

    n = np.array([0.0, 0.0, 0.0, 0.0])
    out = np.array([11, 11, 1, 11])
    log = EpisodeLog(n, np.full(4, 10), out, out, out, np.zeros(4, bool), 100, 16)
    log.first_token_s[:] = [1.0, 3.0, 1.5, 1.0]    # TTFT: 1, 3 (late), 1.5, 1
    log.finish_s[:] = [2.0, 4.0, 1.5, 4.0]         # TPOT: 0.1, 0.1, none (one token), 0.3 (slow)
    ok = met_slo(log, np.arange(4), ttft_slo_s=2.0, itl_slo_s=0.2)
    assert ok.tolist() == [True, False, True, False]


def test_num_met_slo_counts_what_met_slo_marks_one_by_one_and_in_bulk():
    # The per-step count checks a few requests in plain floats and many as arrays: both must agree with met_slo,
    # at the SLO boundaries too (<= on TTFT and TPOT; one-token requests have no TPOT).
    from servegym.engine import EpisodeLog
    from servegym.metrics import met_slo, num_met_slo

    rng = np.random.default_rng(0)
    n = 40
    out = rng.integers(1, 6, n)
    arrival = np.sort(rng.integers(0, 100, n)) / 4.0  # dyadic times: the boundary cases are exact
    log = EpisodeLog(arrival, np.full(n, 10), out, out, out, np.zeros(n, bool), 100, 16)
    log.first_token_s[:] = log.arrival_s + rng.choice([0.5, 1.0, 1.5], n)
    log.finish_s[:] = log.first_token_s + (out - 1) * rng.choice([0.25, 0.5, 0.75], n)
    for size in (1, 2, 8, 9, n):
        ids = rng.choice(n, size, replace=False)
        assert num_met_slo(log, ids, 1.0, 0.5) == int(np.count_nonzero(met_slo(log, ids, 1.0, 0.5))), size
    assert 0 < num_met_slo(log, np.arange(n), 1.0, 0.5) < n


def test_latency_identity_holds_for_a_truncated_pool_episode():
    env = gym.make(ENV_ID, task="serverless-burst", max_steps=200, truncation_penalty_s=5.0)
    total, _, _ = _run(env, seed=3)
    s = summarize(serving_env(env).cluster.log)
    unserved = s["num_requests"] - s["num_finished"] - s["num_rejected"]
    expected = -s["e2e_mean_all_s"] * (s["num_arrived"] - s["num_rejected"]) - 5.0 * unserved
    assert np.isclose(total, expected, rtol=1e-9)


def test_slo_good_requests_are_counted_under_the_latency_reward_too():
    env = gym.make(ENV_ID, workload="medium", max_steps=600)
    _, _, infos = _run(env)
    s = summarize(serving_env(env).cluster.log)
    assert infos[-1]["num_slo_good"] == round(s["goodput_rps"] * s["makespan_s"]) > 0


def test_a_mixture_component_replays_the_mixture_seed():
    mixture = gym.make(ENV_ID, task="mixture")
    obs, info = mixture.reset(seed=900_003)
    alone, _ = gym.make(ENV_ID, task=info["task"]).reset(seed=900_003)
    assert all(np.array_equal(obs[k], alone[k]) for k in obs)


def test_every_task_id_runs_to_its_tasks_own_step_limit():
    # prefix-reuse's 600 s windows run past 20,000 iterations: its id and make_env(task=...) allow its max_steps.
    import gymnasium as gym

    import servegym
    from servegym.envs.tasks import TASKS
    from servegym.runner import make_env

    for task, _ in servegym.TASK_IDS.items():
        limit = gym.spec(servegym.task_id(task)).max_episode_steps
        assert limit == max(TASKS[task].max_steps, 20_000), task
    assert TASKS["prefix-reuse"].max_steps == 200_000
    env = make_env(task="prefix-reuse", split="test")
    assert env.spec.max_episode_steps == 200_000
