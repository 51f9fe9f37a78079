"""The episode-progress features, the agent's scaled observation, and tuning on a mixture task (issue 27)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from servegym.envs import TEST_SEEDS
from servegym.envs.observation import (
    PROGRESS_FEATURES,
    SCALED_BOUND,
    SCHEMA,
    scale_observation,
    scaled_observation_space,
    schema_table,
)
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode
from tests.conftest import fixed, flat_profile

ROOT = Path(__file__).resolve().parents[1]
ARRIVALS = np.array([0.5, 1.5, 2.5, 3.5])


def _progress(obs) -> dict[str, float]:
    return dict(zip(PROGRESS_FEATURES, obs["progress"].tolist(), strict=True))


def test_progress_counts_time_arrivals_and_what_remains_from_the_definition():
    # Four requests arriving at 0.5, 1.5, 2.5 and 3.5 s, 50 output tokens each at 43 ms a step (FCFS): each finishes
    # about 2.2 s after it starts, so arrivals and completions interleave; the third (a 1,000-token prompt) can
    # never fit the 320-token cache and is rejected on arrival: it no longer remains, and it did arrive.
    env = make_env(workload=fixed(ARRIVALS, [10, 10, 1000, 10], [50, 50, 50, 50]), profile=flat_profile(),
                   engine={"length_mode": "known", "num_kv_blocks": 20, "block_size": 16})
    obs, _ = env.reset(seed=0)
    first = _progress(obs)
    assert first == {"elapsed_s": 0.0, "arrival_span_s": 3.0, "arrived_frac": 0.25, "remaining_frac": 1.0}
    fcfs, finished, rejected, seen, done = make_policy("fcfs"), 0, 0, set(), False
    while not done:
        obs, _, terminated, truncated, info = env.step(fcfs.act(obs))
        finished, rejected = finished + info["num_finished"], rejected + info["num_rejected"]
        p = _progress(obs)
        clock = env.unwrapped.cluster.time
        assert p["elapsed_s"] == pytest.approx(clock - 0.5, abs=1e-5) and p["arrival_span_s"] == 3.0
        assert p["arrived_frac"] == pytest.approx(np.sum(clock >= ARRIVALS) / 4, abs=1e-6)
        assert p["remaining_frac"] == pytest.approx((4 - finished - rejected) / 4, abs=1e-6)
        seen.add((p["arrived_frac"], p["remaining_frac"]))
        done = terminated or truncated
    assert rejected == 1 and p["arrived_frac"] == 1.0 and p["remaining_frac"] == 0.0
    assert (0.5, 1.0) in seen and (0.75, 0.5) in seen  # the third arrived (and was rejected) after the first left
    assert "| `progress` | `remaining_frac` | [0, 1] |" in schema_table()
    assert set(SCHEMA) == set(env.observation_space.spaces)


def test_the_scaled_observation_is_symlog_of_every_feature_and_bounded():
    env = make_env(task="memory-tight")
    obs, _ = env.reset(seed=1)
    for _ in range(50):
        obs, *_ = env.step(make_policy("fcfs").act(obs))
    scaled = scale_observation(obs)
    space = scaled_observation_space(env.observation_space)
    assert space.contains(scaled) and set(scaled) == set(obs)
    # By hand: a 1,000-token prompt becomes ln(1001) = 6.909; 0 stays 0; a negative warmth keeps its sign.
    assert scale_observation({"x": np.array([1000.0, 0.0, -2.0])})["x"] == pytest.approx(
        [math.log(1001.0), 0.0, -math.log(3.0)], rel=1e-6)
    assert pytest.approx(math.log1p(1e9)) == SCALED_BOUND
    np.testing.assert_allclose(np.expm1(np.abs(scaled["queue"])) * np.sign(scaled["queue"]), obs["queue"], rtol=1e-4)


def test_an_agent_on_the_scaled_observation_trains_and_plays_on_the_raw_one(tmp_path):
    pytest.importorskip("stable_baselines3")
    from servegym.rl.train import TrainConfig, make_training_env, train

    env = make_training_env({"task": "memory-tight", "decision_steps": True}, "rank", None, (0, 1),
                            observation="scaled")
    obs, _ = env.reset()
    assert env.observation_space.contains(obs) and obs["engine"].max() < 25  # raw KV capacity is 53,000 tokens
    with pytest.raises(ValueError, match="observation must be one of"):
        TrainConfig(mode="rank", observation="normalized")
    with pytest.raises(ValueError, match="has its own network over the raw observation"):
        TrainConfig(mode="score", observation="scaled")
    cfg = TrainConfig(algo="ppo", mode="rank", task="memory-tight", env={"decision_steps": True}, timesteps=64,
                      n_envs=1, eval_freq=64, eval_episodes=1, normalize=False, observation="scaled",
                      hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1}, out=str(tmp_path))
    run = train(cfg, progress=False, subprocess=False)
    agent = make_policy(f"rl:{run}")
    # The agent as a policy reads the raw observation and must act as the model on the scaled one did in training:
    # step by step, its action is the rank mode's mapping of model.predict(scaled observation) from the raw one.
    obs, _ = env.reset(seed=7)
    for _ in range(200):
        raw = env.env._obs  # the action mode's own view, below ScaledObservation
        predicted, _ = agent.model.predict(obs, deterministic=True)
        expected = env.env.to_env_action(raw, predicted)
        assert np.array_equal(agent.act(raw), expected)
        obs, _, terminated, truncated, _ = env.step(predicted)
        if terminated or truncated:
            break
    result = run_episode(make_env(agent, task="memory-tight", split="test", apply_overrides=False), agent,
                         TEST_SEEDS[0])
    assert result.summary["num_finished"] > 0


def test_a_shipped_agent_from_before_the_progress_features_replays_its_leaderboard_return():
    # The v0 rank agent was trained without obs["progress"] (and with VecNormalize over the old keys): it sees its
    # own keys and scores exactly what the leaderboard recorded (a change to the observation that moved it would
    # fail here). On the Serving-v2 board it plays unranked (trained on v0, no data record), in the task's own
    # predicted lengths.
    pytest.importorskip("stable_baselines3")
    name = "rl:Serving-v0__ppo__rank__memory-tight__s0"
    with (ROOT / "docs/bench/leaderboard.csv").open() as handle:
        row = next(r for r in csv.DictReader(handle) if r["task"] == "memory-tight"
                   and r["policy"].startswith(f"{name} [unranked: ") and int(r["seed"]) == TEST_SEEDS[0])
    agent = make_policy(f"rl:{ROOT / 'docs/rl' / name.removeprefix('rl:')}")
    result = run_episode(make_env(agent, task="memory-tight", split="test", apply_overrides=False), agent,
                         TEST_SEEDS[0])
    assert result.total_reward == pytest.approx(float(row["episode_return"]), rel=1e-12)


def test_tuning_on_a_mixture_plays_the_tasks_own_episodes():
    from servegym.tuning.study import TuneConfig, evaluate

    seeds = [10_000, 10_001, 10_002, 10_003]
    tuned = evaluate("fcfs", {}, None, seeds, 100_000, {"task": "mixture"})
    direct = [run_episode(make_env(task="mixture"), make_policy("fcfs"), seed).total_reward for seed in seeds]
    assert [r["episode_return"] for r in tuned] == direct
    assert len({round(r, 3) for r in direct}) == len(seeds)
    assert TuneConfig(policy="scorer", workload=None, env={"task": "mixture"}).name == "scorer-mixture-goodput"
    with pytest.raises(ValueError, match="env\\['task'\\] must name the task"):
        TuneConfig(policy="scorer", workload=None)
