"""``flat_obs=True``: one Box that is exactly ``spaces.flatten`` of the Dict observation, step for step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import servegym
from servegym.envs.observation import ENGINE_INDEX, POOL_FEATURES, POOL_INDEX, QUEUE_FEATURES, RUNNING_FEATURES
from servegym.policies import make_policy
from tests.conftest import make

POOL = {"num_containers": 3, "keep_alive_s": 2.0}
"""Three containers, so the pool part is 18 long and sits between engine (17) and the queue."""


def _episode(flat: bool, steps: int = 400) -> list:
    policy = make_policy("fcfs")
    env = make("burst", pool=POOL, queue_window=8, flat_obs=flat)
    obs, _ = env.reset(seed=3)
    seen = [obs]
    for _ in range(steps):
        view = spaces.unflatten(env.unwrapped.dict_observation_space, obs) if flat else obs
        action = policy.act(view)
        obs, _, terminated, truncated, _ = env.step(action)
        seen.append(obs)
        if terminated or truncated:
            break
    return seen


def test_flat_observation_is_gymnasiums_flatten_of_the_dict_at_every_step():
    dict_env = make("burst", pool=POOL, queue_window=8)
    space = dict_env.observation_space
    dict_obs, flat_obs = _episode(False), _episode(True)
    assert len(dict_obs) == len(flat_obs) > 100  # the same decisions, so the same episode
    size = 17 + 3 * len(POOL_FEATURES) + 4 + 8 * len(QUEUE_FEATURES) + 128 * len(RUNNING_FEATURES)
    for d, f in zip(dict_obs, flat_obs, strict=True):
        assert f.dtype == np.float32 and f.shape == (size,)
        np.testing.assert_array_equal(f, spaces.flatten(space, d))
    # Spot checks by layout: the engine block first, then the pool block (the deciding flag set once).
    last = flat_obs[-1]
    assert last[ENGINE_INDEX["kv_block_size"]] == 16
    pool = last[17 : 17 + 18].reshape(3, len(POOL_FEATURES))
    assert pool[:, POOL_INDEX["deciding"]].sum() == 1.0


def test_flat_env_passes_gymnasiums_checker_and_its_space_is_a_box():
    env = make("low", flat_obs=True)
    assert isinstance(env.observation_space, spaces.Box)
    assert env.observation_space.shape == spaces.flatten_space(env.unwrapped.dict_observation_space).shape
    check_env(env.unwrapped, skip_render_check=True)


def test_observations_do_not_alias_across_steps():
    for flat in (False, True):
        env = make("high", flat_obs=flat)
        first, _ = env.reset(seed=0)
        kept = {k: v.copy() for k, v in first.items()} if not flat else first.copy()
        for _ in range(20):
            env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
        if flat:
            np.testing.assert_array_equal(first, kept)
        else:
            for key, value in kept.items():
                np.testing.assert_array_equal(first[key], value)


def test_flat_obs_must_be_a_bool():
    with pytest.raises(ValueError, match="flat_obs must be true or false"):
        make("low", flat_obs="yes")


def test_flat_obs_vectorises():
    envs = gym.make_vec(servegym.ENV_ID, num_envs=2, vectorization_mode="sync", workload="low", flat_obs=True)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, envs.single_observation_space.shape[0])
    obs, *_ = envs.step(np.zeros((2, 32), dtype=np.int64))
    assert obs.dtype == np.float32 and np.all(obs[:, ENGINE_INDEX["kv_block_size"]] == 16)
    envs.close()
