"""Learned comparators: wrappers, smoke training per algorithm and mode, masks, save/load, rl: policies."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from servegym import ENV_ID
from servegym.policies import make_policy
from servegym.rl import AdmitCount, AdmitMask, TokenWindow
from servegym.rl.train import TrainConfig, algorithm_class, make_training_env, train
from tests.conformance import assert_conforms

TINY = {
    "ppo": {"n_steps": 64, "batch_size": 64, "n_epochs": 1},
    "a2c": {"n_steps": 16},
    "dqn": {"learning_starts": 64, "buffer_size": 1000, "batch_size": 32},
    "sac": {"learning_starts": 64, "buffer_size": 1000, "batch_size": 32},
    "maskable-ppo": {"n_steps": 64, "batch_size": 64, "n_epochs": 1},
}
CASES = [("ppo", "admit"), ("ppo", "window"), ("ppo", "count"), ("a2c", "count"), ("dqn", "count"),
         ("sac", "window"), ("maskable-ppo", "admit"), ("maskable-ppo", "count")]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    cfg = TrainConfig(algo="ppo", mode="count", workload="low", timesteps=256, n_envs=2, max_episode_steps=200,
                      eval_freq=256, eval_episodes=1, hyperparams=TINY["ppo"], out=str(tmp_path_factory.mktemp("runs")))
    return train(cfg, progress=False, subprocess=False)


@pytest.mark.parametrize("wrapper", [AdmitMask, TokenWindow, AdmitCount])
def test_wrappers_pass_both_env_checkers(wrapper):
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The one notice inherent to checking a wrapper; every other warning fails the test.
        warnings.filterwarnings("ignore", message=".*different from the unwrapped version.*")
        check_env(wrapper(gym.make(ENV_ID, workload="low").unwrapped), skip_render_check=True)
        sb3_check_env(wrapper(gym.make(ENV_ID, workload="low").unwrapped), warn=True)


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "mode"), CASES)
def test_smoke_training_per_algorithm_and_mode(algo, mode, tmp_path):
    cfg = TrainConfig(algo=algo, mode=mode, workload="low", timesteps=256, n_envs=2, max_episode_steps=150,
                      eval_freq=128, eval_episodes=1, hyperparams=TINY[algo], out=str(tmp_path))
    run = train(cfg, progress=False, subprocess=False)
    assert (run / "model.zip").is_file() and (run / "vecnormalize.pkl").is_file()
    assert (run / "best_model.zip").is_file() and (run / "best_vecnormalize.pkl").is_file()
    assert any((run / "tb").rglob("events.out.tfevents*"))
    assert run.name == f"Serving-v2__{algo}__{mode}__low__s0"


def test_incompatible_algorithm_and_mode_is_refused():
    with pytest.raises(ValueError, match="dqn cannot use mode 'window'"):
        TrainConfig(algo="dqn", mode="window")


@pytest.mark.slow
def test_save_and_load_give_identical_actions(tmp_path):
    env = make_training_env({"workload": "low", "engine": {"length_mode": "predicted"}}, "count", 300)
    algo = algorithm_class("ppo")
    model = algo("MultiInputPolicy", env, seed=0, **TINY["ppo"])
    model.learn(128)
    obs_list, (obs, _) = [], env.reset(seed=3)
    for _ in range(100):
        obs_list.append(obs)
        obs, _, terminated, truncated, _ = env.step(model.predict(obs, deterministic=True)[0])
        if terminated or truncated:
            obs, _ = env.reset()
    model.save(tmp_path / "m.zip")
    loaded = algo.load(tmp_path / "m.zip")
    for o in obs_list:
        assert model.predict(o, deterministic=True)[0] == loaded.predict(o, deterministic=True)[0]


@pytest.mark.slow
def test_masked_agent_never_picks_a_masked_action():
    from sb3_contrib import MaskablePPO

    env = AdmitMask(gym.make(ENV_ID, workload="burst", strict_actions=True, max_episode_steps=10**6).unwrapped)
    model = MaskablePPO("MultiInputPolicy", env, seed=0, **TINY["maskable-ppo"])
    obs, _ = env.reset(seed=0)
    admitted = 0
    for _ in range(3_000):
        mask = env.action_masks().reshape(-1, 2)
        action, _ = model.predict(obs, action_masks=mask.ravel(), deterministic=False)
        assert np.all(mask[np.arange(action.size), action])
        admitted += int(action.sum())
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    assert admitted > 0


@pytest.mark.slow
def test_trained_agent_passes_the_policy_conformance_suite(tiny_run):
    assert_conforms(lambda: make_policy(f"rl:{tiny_run}"))


def test_rl_policy_runs_in_compare(tiny_run, tmp_path):
    from servegym.evaluation import compare, experiment_from_dict

    experiment = experiment_from_dict({"name": "rl", "seeds": 1, "max_steps": 300, "workloads": ["azure-code"],
                                       "policies": ["fcfs", f"rl:{tiny_run}"]})
    results, _ = compare(experiment, tmp_path, workers=1, progress=False, plots=False)
    assert {r.policy for r in results} == {"fcfs", f"rl:{tiny_run}"}


def test_bad_rl_run_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not a servegym train run"):
        make_policy(f"rl:{tmp_path}")


@pytest.mark.parametrize("mode", ["count", "window", "rank"])
def test_random_floors_take_a_uniform_action_of_their_mode(mode):
    from servegym.rl.random_floor import RandomAction
    from servegym.rl.wrappers import (
        MAX_ADMIT,
        RANK_MEMORY_TARGETS,
        RANK_ORDERS,
        count_action,
        rank_action,
        window_action,
    )

    floor = make_policy(f"random:{mode}", seed=3)
    assert isinstance(floor, RandomAction) and floor.params.mode == mode
    assert_conforms(lambda: make_policy(f"random:{mode}", seed=3))
    env = gym.make(ENV_ID, task="memory-tight")
    obs, _ = env.reset(seed=0)
    for _ in range(30):  # wait, so that a queue builds up for the floors to choose from
        obs, *_ = env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    assert obs["engine"].size and len(obs["queue"]) > 0
    floor.reset()
    rng = np.random.default_rng(3)  # the floor's own draws, replayed
    for _ in range(5):
        expected = {"count": lambda: count_action(obs, int(rng.integers(MAX_ADMIT + 1))),
                    "window": lambda: window_action(obs, float(rng.uniform(-1.0, 1.0))),
                    "rank": lambda: rank_action(obs, int(rng.integers(len(RANK_ORDERS))),
                                                int(rng.integers(len(RANK_MEMORY_TARGETS))))}[mode]()
        np.testing.assert_array_equal(floor.act(obs), expected)
    with pytest.raises(ValueError, match="mode must be one of"):
        make_policy("random:admit")
