"""Every gym.make argument of the wrong type or value is a clear error, not a quiet wrong result."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from servegym import ENV_ID
from servegym.policies import make_policy
from servegym.runner import make_env


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"workload": None}, TypeError, "workload must be a name"),
    ({"engine": [1, 2]}, TypeError, "engine must be a EngineConfig or a dict"),
    ({"pool": "big"}, TypeError, "pool must be a PoolConfig or a dict"),
    ({"engine": {"foo": 1}}, ValueError, r"engine: unknown key\(s\) \['foo'\]"),
    ({"pool": {"start_cold": "no"}}, ValueError, "start_cold must be true or false"),
    ({"pool": {"cold_start_s": 1e9}}, ValueError, "cold_start_s must be in"),
    ({"pool": {"keep_alive_s": -1}}, ValueError, "keep_alive_s must be in"),
    ({"pool": {"cold_start_s": 9e5, "cold_start_scale": 10}}, ValueError, "exceeds"),
    ({"profile": 3}, TypeError, "profile must be"),
    ({"reward": 1}, TypeError, "reward must be a string"),
    ({"reward": "money"}, ValueError, "unknown reward"),
    ({"strict_actions": "yes"}, ValueError, "strict_actions must be true or false"),
    ({"latency_noise_cv": -0.1}, ValueError, "latency_noise_cv"),
    ({"queue_window": 0}, ValueError, "queue_window"),
    ({"max_steps": 0}, ValueError, "max_steps"),
    ({"idle_guard_steps": -3}, ValueError, "idle_guard_steps"),
    ({"reward_half_life_s": 0}, ValueError, "reward_half_life_s"),
    ({"ttft_slo_s": float("nan")}, ValueError, "ttft_slo_s"),
    ({"engine": {"check_invariants": 1}}, ValueError, "check_invariants must be true or false"),
])
def test_bad_make_arguments_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make(ENV_ID, **kwargs)


def test_make_env_refuses_a_non_positive_episode_limit():
    with pytest.raises(ValueError, match="max_episode_steps"):
        make_env(make_policy("fcfs"), max_episode_steps=-1, workload="low")


def test_the_largest_accepted_cold_start_keeps_observations_in_their_space():
    env = gym.make(ENV_ID, workload="low", pool={"num_containers": 2, "cold_start_s": 1e6, "start_cold": True})
    obs, _ = env.reset(seed=0)
    for _ in range(60):
        obs, _, terminated, truncated, _ = env.step(np.ones(32, dtype=np.int64))
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            break


def test_a_boolean_admit_mask_is_an_admit_mask():
    def first_step(action):
        env = gym.make(ENV_ID, workload="medium")
        env.reset(seed=3)
        return env.step(action)[4]["num_admitted"]

    mask = np.zeros(32, dtype=bool)
    mask[:2] = True
    assert first_step(mask) == first_step(mask.astype(np.int64)) >= 1


def test_a_thrashing_policy_is_warned_about_once():
    policy = make_policy("alpha-protection")
    env = make_env(policy, max_episode_steps=3000, workload="medium",
                   engine={"length_mode": "unknown", "num_kv_blocks": 300})
    obs, _ = env.reset(seed=0)
    with pytest.warns(RuntimeWarning, match="thrashing") as record:
        for _ in range(3000):
            obs, _, terminated, truncated, _ = env.step(policy.act(obs))
            if terminated or truncated:
                break
    assert len([w for w in record if "thrashing" in str(w.message)]) == 1
