"""Residual agents on a tuned scorer, and discounting in simulated seconds (issue 27)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from servegym.envs import TEST_SEEDS, VALIDATION_SEEDS
from servegym.policies import make_policy
from servegym.policies.common import admit_by_score
from servegym.rl.wrappers import SCORE_TARGETS, ScoreAdmit, score_action
from servegym.runner import make_env, run_episode
from tests.conftest import fixed, flat_profile

TUNED = {"output_weight": 3.8, "wait_weight": 5.2, "target_base": 0.58, "target_slope": 0.24}


def _two_waiting():
    # Prompts 1000 and 1100 tokens (known lengths, 0 output weight below): the scorer ranks the shorter first.
    env = make_env(workload=fixed(np.zeros(2), [1000, 1100], [4, 4]), profile=flat_profile(),
                   engine={"length_mode": "known", "num_kv_blocks": 200, "block_size": 16})
    obs, _ = env.reset(seed=0)
    return env, obs


def _first(admit: np.ndarray) -> int:
    return int(np.flatnonzero(admit == 1)[0])


def _zero_residual_steps(params: dict, seed: int):
    """Each step of an episode played at residual 0 on ``params``' scorer: (obs, the scorer's action, the
    residual mode's action)."""
    scorer = make_policy("scorer", **params)
    env = ScoreAdmit(make_env(scorer, task="memory-tight"), base=params)
    obs, _ = env.reset(seed=seed)
    zero = np.zeros(env.action_space.shape, dtype=np.float32)
    done = False
    while not done:
        yield obs, scorer.act(obs), env.to_env_action(obs, zero)
        obs, _, terminated, truncated, _ = env.step(zero)
        done = terminated or truncated


def test_a_zero_residual_is_the_scorer_and_differs_from_fcfs():
    # Rule: action 0 admits exactly what the base scorer admits, every step of an episode (the scorer is not FCFS
    # there, so a wrapper that ignored its base would fail).
    fcfs = make_policy("fcfs")
    steps = [(np.array_equal(got, want), np.array_equal(fcfs.act(obs), want))
             for obs, want, got in _zero_residual_steps(TUNED, 5)]
    assert len(steps) > 500 and all(same for same, _ in steps) and sum(not f for _, f in steps) > 10


def test_a_zero_residual_is_the_scorer_even_outside_the_plain_target_range():
    # Bug caught: the base's memory target went through the plain mode's [0.3, 1.5] map, so a scorer whose target
    # stays below 0.3 of the cache was raised to 0.3 and action 0 was no longer the scorer.
    tight = {"output_weight": 1.0, "wait_weight": 0.0, "target_base": 0.15, "target_slope": 0.1}
    scorer = make_policy("scorer", **tight)
    differ, clipped_differ, highest = 0, 0, 0.0
    for obs, want, got in _zero_residual_steps(tight, 3):
        differ += not np.array_equal(got, want)
        raised = max(0.3, scorer.memory_target(obs))
        clipped_differ += not np.array_equal(admit_by_score(obs, scorer.scores(obs), raised), want)
        highest = max(highest, scorer.memory_target(obs))
    assert highest < 0.3 and clipped_differ > 0 and differ == 0


def test_a_residual_reorders_only_past_its_score_ratio():
    # Scores -1000 and -1100 tokens (prompt only): slot 1 overtakes slot 0 when its log-score rises by more than
    # ln(1101 / 1001) = 0.0952, i.e. a residual above 0.0952 / 0.2 = 0.476 at scale 0.2.
    env, obs = _two_waiting()
    width = obs["queue"].shape[0] // 6
    base = {"output_weight": 0.0, "target_base": 1.0}
    action = np.zeros(width + 1)
    assert _first(score_action(obs, action, make_policy("scorer", **base), 0.2)) == 0
    for a, first in ((0.47, 0), (0.49, 1), (1.0, 1)):
        action[1] = a
        assert _first(score_action(obs, action, make_policy("scorer", **base), 0.2)) == first, a
    action[1] = 0.49  # at scale 0.19 the same action no longer reaches the ratio
    assert _first(score_action(obs, action, make_policy("scorer", **base), 0.19)) == 0
    env.close()


def test_a_residual_moves_the_memory_target_by_its_scale():
    # 200 blocks of 16 = 3200 tokens; prompts 1000 and 1100 with 4 output tokens need about 1015 and 1115 with
    # block slack: both fit under 0.75 x 3200 = 2400 tokens, only the first under 0.6 x 3200 = 1920. The base target
    # 0.9 is action value 2 (0.9 - 0.3) / 1.2 - 1 = 0; a residual of -1 at scale 0.5 moves it to -0.5, a target of
    # 0.3 + 0.25 x 1.2 = 0.6 (one admitted); -0.5 moves it to -0.25, 0.3 + 0.375 x 1.2 = 0.75 (both).
    env, obs = _two_waiting()
    width = obs["queue"].shape[0] // 6
    scorer = make_policy("scorer", output_weight=0.0, target_base=0.9)
    assert score_action(obs, np.zeros(width + 1), scorer, 0.5)[:2].tolist() == [1, 2]  # ranks: both, the shorter first
    assert score_action(obs, np.r_[np.zeros(width), -1.0], scorer, 0.5)[:2].tolist() == [1, 0]
    assert score_action(obs, np.r_[np.zeros(width), -0.5], scorer, 0.5)[:2].tolist() == [1, 2]
    low, high = SCORE_TARGETS
    assert (low, high) == (0.3, 1.5)  # the arithmetic above
    env.close()


def test_bad_residual_settings_are_clear_errors():
    pytest.importorskip("stable_baselines3")
    from servegym.rl.train import TrainConfig

    with pytest.raises(ValueError, match="residual_scale must be finite and > 0"):
        ScoreAdmit(make_env(task="memory-tight"), base=TUNED, residual_scale=0.0)
    with pytest.raises(ValueError, match="score_base is the base scorer of the score and params modes"):
        TrainConfig(mode="rank", score_base="best_params.json")
    with pytest.raises(ValueError, match="residual_scale must be a finite number > 0"):
        TrainConfig(mode="score", residual_scale=math.inf)
    with pytest.raises(ValueError, match="residual_scale scales a residual on a base scorer"):
        TrainConfig(mode="score", residual_scale=0.5)
    with pytest.raises(ValueError, match="two warm starts"):
        TrainConfig(mode="score", imitate="a.json", score_base="a.json")
    with pytest.raises(ValueError, match="without normalize"):
        TrainConfig(mode="rank", observation="scaled")
    with pytest.raises(ValueError, match="discount_half_life_s discounts PPO's and A2C's rollouts"):
        TrainConfig(algo="sac", mode="score", discount_half_life_s=20.0)
    with pytest.raises(ValueError, match="discount_half_life_s must be a finite number > 0"):
        TrainConfig(mode="score", discount_half_life_s=-1.0)


# --- discounting in simulated seconds ---------------------------------------------------------------------------


def _buffer(discounts, rewards, values, starts, gae_lambda):
    pytest.importorskip("stable_baselines3")
    from gymnasium import spaces

    from servegym.rl.time_discount import TimeDiscountBuffer

    buffer = TimeDiscountBuffer(len(rewards), spaces.Box(-1, 1, (1,)), spaces.Box(-1, 1, (1,)), gae_lambda=gae_lambda,
                                gamma=0.123, n_envs=1)
    buffer.rewards[:, 0], buffer.values[:, 0] = rewards, values
    buffer.episode_starts[:, 0], buffer.discounts[:, 0] = starts, discounts
    return buffer


def test_returns_and_advantages_discount_each_step_by_its_own_factor():
    import torch

    # By hand, lambda 1 (Monte Carlo with the last value bootstrapped): R2 = 3 + 1.0 x 2 = 5,
    # R1 = 2 + 0.25 x 5 = 3.25, R0 = 1 + 0.5 x 3.25 = 2.625. The algorithm's gamma (0.123) is used nowhere.
    buffer = _buffer([0.5, 0.25, 1.0], [1.0, 2.0, 3.0], [0.5, 1.0, 1.5], [1, 0, 0], 1.0)
    buffer.compute_returns_and_advantage(torch.tensor([2.0]), np.array([False]))
    assert buffer.returns[:, 0] == pytest.approx([2.625, 3.25, 5.0], abs=1e-6)
    # lambda 0.5: delta2 = 3 + 2 - 1.5 = 3.5, delta1 = 2 + 0.25 x 1.5 - 1 = 1.375, delta0 = 1 + 0.5 x 1 - 0.5 = 1;
    # A2 = 3.5, A1 = 1.375 + 0.25 x 0.5 x 3.5 = 1.8125, A0 = 1 + 0.5 x 0.5 x 1.8125 = 1.453125.
    buffer = _buffer([0.5, 0.25, 1.0], [1.0, 2.0, 3.0], [0.5, 1.0, 1.5], [1, 0, 0], 0.5)
    buffer.compute_returns_and_advantage(torch.tensor([2.0]), np.array([False]))
    assert buffer.advantages[:, 0] == pytest.approx([1.453125, 1.8125, 3.5], abs=1e-6)
    # An episode start at step 2 cuts the sum there; a terminal last step drops the bootstrap.
    buffer = _buffer([0.5, 0.25, 1.0], [1.0, 2.0, 3.0], [0.5, 1.0, 1.5], [1, 0, 1], 1.0)
    buffer.compute_returns_and_advantage(torch.tensor([2.0]), np.array([True]))
    assert buffer.returns[:, 0] == pytest.approx([2.0, 2.0, 3.0], abs=1e-6)


def test_a_constant_discount_reproduces_sb3s_gae():
    pytest.importorskip("stable_baselines3")
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    rng = np.random.default_rng(3)
    rewards, values = rng.normal(size=(16, 2)), rng.normal(size=(16, 2))
    starts = (rng.random((16, 2)) < 0.2).astype(np.float32)
    box = spaces.Box(-1, 1, (1,))
    from servegym.rl.time_discount import TimeDiscountBuffer

    ours = TimeDiscountBuffer(16, box, box, gae_lambda=0.9, gamma=0.0, n_envs=2)
    sb3 = RolloutBuffer(16, box, box, gae_lambda=0.9, gamma=0.97, n_envs=2)
    for buffer in (ours, sb3):
        buffer.rewards[:], buffer.values[:], buffer.episode_starts[:] = rewards, values, starts
    ours.discounts[:] = 0.97
    last, dones = torch.tensor([0.3, -0.7]), np.array([False, True])
    ours.compute_returns_and_advantage(last, dones)
    sb3.compute_returns_and_advantage(last, dones)
    np.testing.assert_allclose(ours.advantages, sb3.advantages, rtol=1e-5, atol=1e-6)


def test_training_writes_each_steps_discount_from_its_simulated_seconds():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList
    from stable_baselines3.common.vec_env import DummyVecEnv

    from servegym.rl.fast_dist import policy_for
    from servegym.rl.time_discount import TimeDiscount, buffer_class
    from servegym.rl.train import make_training_env

    class Seconds(BaseCallback):
        def _init_callback(self) -> None:
            self.seconds = []

        def _on_step(self) -> bool:
            self.seconds.append([info["step_s"] for info in self.locals["infos"]])
            return True

        def _on_rollout_end(self) -> None:
            self.discounts = self.model.rollout_buffer.discounts.copy()

    venv = DummyVecEnv([lambda: make_training_env({"task": "memory-tight", "decision_steps": True}, "score",
                                                  None, (0, 1))])
    model = PPO(policy_for("ppo", venv.action_space, "score"), venv, n_steps=32, batch_size=32, n_epochs=1, seed=0,
                rollout_buffer_class=buffer_class(True))
    seconds = Seconds()
    model.learn(32, callback=CallbackList([TimeDiscount(2.0), seconds]))
    step_s = np.asarray(seconds.seconds)
    assert step_s.shape == (32, 1) and np.ptp(step_s) > 0  # steps of different lengths
    np.testing.assert_allclose(seconds.discounts, 2.0 ** (-step_s / 2.0), rtol=1e-6)
    with pytest.raises(TypeError, match="needs the rollout buffer"):
        PPO(policy_for("ppo", venv.action_space, "score"), venv, n_steps=32, batch_size=32).learn(
            32, callback=TimeDiscount(2.0))
    venv.close()


def test_a_time_limit_truncation_bootstraps_with_its_own_steps_discount():
    # SB3 adds gamma x V(terminal) to a truncated step's reward; the callback makes it gamma_t x V(terminal).
    pytest.importorskip("stable_baselines3")
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList
    from stable_baselines3.common.vec_env import DummyVecEnv

    from servegym.rl.fast_dist import policy_for
    from servegym.rl.time_discount import TimeDiscount, buffer_class
    from servegym.rl.train import make_training_env

    def short():  # gym.make's TimeLimit: every 5th step is a time-limit truncation
        import gymnasium as gym

        env = make_training_env({"task": "memory-tight", "decision_steps": True}, "score", None, (0, 1))
        return gym.wrappers.TimeLimit(env, max_episode_steps=5)

    class Record(BaseCallback):
        def _init_callback(self) -> None:
            self.steps = []

        def _on_step(self) -> bool:
            info = self.locals["infos"][0]
            self.steps.append((float(self.locals["rewards"][0]), info["step_s"], info.get("terminal_observation")))
            return True

    venv = DummyVecEnv([short])
    model = PPO(policy_for("ppo", venv.action_space, "score"), venv, n_steps=16, batch_size=16, n_epochs=1,
                seed=0, gamma=0.5, learning_rate=0.0, rollout_buffer_class=buffer_class(True))
    record = Record()
    model.learn(16, callback=CallbackList([record, TimeDiscount(2.0)]))  # record the reward before the fix
    stored = model.rollout_buffer.rewards[:, 0]
    truncated = [i for i, (_, _, terminal) in enumerate(record.steps) if terminal is not None]
    assert truncated == [4, 9, 14]
    for i, (reward, step_s, terminal) in enumerate(record.steps):
        if terminal is None:
            assert stored[i] == pytest.approx(reward, rel=1e-6)
            continue
        with torch.no_grad():
            value = float(model.policy.predict_values(model.policy.obs_to_tensor(terminal)[0])[0])
        assert stored[i] == pytest.approx(reward + 2.0 ** (-step_s / 2.0) * value, rel=1e-5, abs=1e-6)
    venv.close()


@pytest.mark.slow  # trains a tiny agent (about 20 s)
def test_a_residual_agent_with_time_discounting_trains_records_its_base_and_starts_as_the_scorer(tmp_path):
    pytest.importorskip("stable_baselines3")
    from servegym.rl.train import TrainConfig, train
    from servegym.tuning.study import write_params

    params = tmp_path / "scorer" / "best_params.json"
    write_params("scorer", TUNED, params)
    cfg = TrainConfig(algo="ppo", mode="score", task="memory-tight", env={"decision_steps": True}, timesteps=64,
                      n_envs=1, eval_freq=10_000, eval_episodes=1, normalize=False, score_base=str(params),
                      residual_scale=0.3, discount_half_life_s=20.0,
                      hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1, "learning_rate": 0.0,
                                   "policy_kwargs": {"head_gain": 0.0}}, out=str(tmp_path / "runs"))
    run = train(cfg, progress=False, subprocess=False)
    state = json.loads((run / "config.json").read_text())
    assert state["status"] == "finished" and state["score_base_params"] == TUNED and state["residual_scale"] == 0.3
    # Learning rate 0 and a zero head: the agent's mean action is 0, so it plays the tuned scorer's episode.
    agent = make_policy(f"rl:{run}")
    env = make_env(agent, task="memory-tight", split="test", apply_overrides=False)
    mine = run_episode(env, agent, TEST_SEEDS[0])
    scorer = make_policy("scorer", **TUNED)
    theirs = run_episode(make_env(scorer, task="memory-tight", split="test", apply_overrides=False), scorer,
                         TEST_SEEDS[0])
    assert mine.total_reward == theirs.total_reward
    assert mine.total_reward != run_episode(make_env(task="memory-tight", split="test"), make_policy("fcfs"),
                                            TEST_SEEDS[0]).total_reward
    # A warm start is scored before its first step, as a reference (the scorer's validation return), not as a
    # candidate: with no evaluation due in 64 steps the final model is scored once more and kept as the best.
    rows = [line.split(",") for line in (run / "eval.csv").read_text().splitlines()]
    validation = run_episode(make_env(scorer, task="memory-tight"), scorer, VALIDATION_SEEDS[0]).total_reward
    assert [int(step) for step, _ in rows] == [0, 64] and float(rows[0][1]) == pytest.approx(validation, rel=1e-12)
    assert state["best_timesteps"] == 64


# --- the params mode --------------------------------------------------------------------------------------------


def test_the_params_mode_moves_the_base_scorers_parameters_by_their_reach():
    from servegym.rl.wrappers import PARAMS_REACH, params_action, score_base, state_params

    base = score_base(TUNED)
    # By hand: (1 + 3.8) e^0.7 - 1 = 8.666, (1 + 5.2) e^-0.35 - 1 = 3.369, 0.58 + 0.2 x 0.5 = 0.68,
    # 0.24 - 0.2 = 0.04; action 0 is the base itself; values past 1 are clipped.
    assert PARAMS_REACH == (0.7, 0.7, 0.2, 0.2)
    assert state_params(base, [1.0, -0.5, 0.5, -1.0]) == pytest.approx(
        (4.8 * math.exp(0.7) - 1, 6.2 * math.exp(-0.35) - 1, 0.68, 0.04), rel=1e-12)
    assert state_params(base, [0, 0, 0, 0]) == pytest.approx(tuple(TUNED.values()), rel=1e-12)
    assert state_params(base, [3.0, 0, 0, 0]) == state_params(base, [1.0, 0, 0, 0])
    with pytest.raises(ValueError, match="a params action is 4 finite values"):
        state_params(base, [0.0, 0.0, math.nan, 0.0])
    # Every step of an episode: the moved parameters act exactly as a scorer built with them.
    moved = make_policy("scorer", **dict(zip(TUNED, state_params(base, [1.0, -0.5, 0.5, -1.0]), strict=True)))
    env = make_env(moved, task="memory-tight")
    obs, _ = env.reset(seed=2)
    for _ in range(300):
        want = moved.act(obs)
        assert np.array_equal(params_action(obs, np.array([1.0, -0.5, 0.5, -1.0]), base), want)
        obs, _, terminated, truncated, _ = env.step(want)
        if terminated or truncated:
            break
    pytest.importorskip("stable_baselines3")
    from servegym.rl.train import TrainConfig

    with pytest.raises(ValueError, match="the params mode moves a base scorer's parameters"):
        TrainConfig(mode="params")
