"""The env contract's edges (issue 48): an episode the env ended, by termination or by its own truncation, cannot
be stepped again (the truncation charge is never paid twice); ``reset(options=...)`` refuses what it would ignore;
a task's own id builds only its task, with its settings; ``split`` means nothing without a task and is refused."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import servegym
from servegym.envs import ServingEnv
from servegym.envs.mixture import LOCKED, make_serving_env


def _truncating_env(**kwargs) -> ServingEnv:
    return ServingEnv(workload="high", max_steps=5, truncation_penalty_s=100.0, **kwargs)


def test_stepping_after_the_envs_own_truncation_raises_and_charges_nothing_twice():
    env = _truncating_env()
    env.reset(seed=0)
    admit = np.ones(env.action_space.shape, dtype=env.action_space.dtype)
    rewards, truncated = [], False
    while not truncated:
        _, reward, terminated, truncated, _ = env.step(admit)
        assert not terminated
        rewards.append(reward)
    assert len(rewards) == 5  # max_steps=5: the fifth step truncates, and it alone carries the charge
    assert rewards[-1] < -100.0 * env.num_unserved + 1e-9 and env.num_unserved > 0
    with pytest.raises(RuntimeError, match=r"truncated .*call reset"):
        env.step(admit)
    env.reset(seed=0)  # reset clears it: the same episode again, same rewards
    again = [env.step(admit)[1] for _ in range(5)]
    np.testing.assert_allclose(again, rewards, rtol=0, atol=0)


def test_the_idle_guard_truncation_also_ends_the_episode_for_step():
    env = ServingEnv(workload="high", idle_guard_steps=3)
    env.reset(seed=0)
    wait = np.zeros(env.action_space.shape, dtype=env.action_space.dtype)
    truncated, info, steps = False, {}, 0
    while not truncated:
        _, _, _, truncated, info = env.step(wait)
        steps += 1
        assert steps < 100
    assert info.get("idle_guard") is True
    with pytest.raises(RuntimeError, match="truncated"):
        env.step(wait)


def test_a_time_limit_wrapper_truncation_leaves_the_env_steppable():
    # TimeLimit (gym.make's max_episode_steps) is the wrapper's end, not the env's: Gymnasium lets the caller go on.
    env = gym.make("servegym/Serving-v2", workload="high", max_episode_steps=2)
    env.reset(seed=0)
    admit = np.ones(env.action_space.shape, dtype=env.action_space.dtype)
    assert env.step(admit)[3] is False and env.step(admit)[3] is True
    env.unwrapped.step(admit)  # the env itself never truncated, so nothing to refuse


@pytest.mark.parametrize(("options", "error", "match"), [
    ("x", TypeError, "reset options must be a dict or None, got str 'x'"),
    ([("a", 1)], TypeError, "must be a dict"),
    ({"foo": 1}, ValueError, r"reset options \['foo'\] are not understood"),
])
def test_reset_options_are_checked(options, error, match):
    env = ServingEnv(workload="low")
    with pytest.raises(error, match=match):
        env.reset(seed=0, options=options)
    env.reset(seed=0, options={})  # empty and None are Gymnasium's "no options"
    env.reset(seed=0, options=None)


def test_a_task_id_refuses_another_task():
    with pytest.raises(ValueError, match=r"servegym/MemoryTight-v2 is the task 'memory-tight'; it cannot build "
                                         r"task='relaxed'"):
        gym.make("servegym/MemoryTight-v2", task="relaxed")
    env = gym.make("servegym/MemoryTight-v2", task="memory-tight")  # naming its own task is fine
    assert env.unwrapped.engine_config.num_kv_blocks == make_serving_env("memory-tight").engine_config.num_kv_blocks


@pytest.mark.parametrize("key", LOCKED)
def test_a_task_id_refuses_to_change_what_its_task_fixes(key):
    value = {"engine": {"num_kv_blocks": 10}, "pool": {"num_containers": 2}, "workload": "low",
             "profile": "a100-llama3-8b", "reward": "tokens", "max_steps": 10, "idle_guard_steps": 10,
             "truncation_penalty_s": 1.0}[key]
    with pytest.raises(ValueError, match=rf"servegym/MemoryTight-v2 fixes {key}; to change them anyway, pass "
                                         r"unlocked=True"):
        gym.make("servegym/MemoryTight-v2", **{key: value})
    gym.make("servegym/Serving-v2", task="memory-tight", **{key: value})  # the generic id takes overrides
    unlocked = gym.make("servegym/MemoryTight-v2", unlocked=True, **{key: value})  # asked for explicitly: recorded
    assert unlocked.spec.kwargs["unlocked"] is True and unlocked.spec.kwargs[key] == value
    unlocked.close()


def test_a_task_id_refuses_another_version():
    # servegym/LongContext-v2 with version=0 would replay v0's whole-trace windows, test tiles included.
    with pytest.raises(ValueError, match=r"servegym/LongContext-v2 is version 2 of its task; version=0 needs "):
        gym.make("servegym/LongContext-v2", version=0)
    assert gym.make("servegym/LongContext-v2", version=0, unlocked=True).spec.kwargs["version"] == 0


def test_unlocked_must_be_a_bool():
    with pytest.raises(ValueError, match="unlocked must be True or False, got 'yes'"):
        gym.make("servegym/MemoryTight-v2", unlocked="yes")


def test_split_without_a_task_is_refused_and_with_a_task_picks_the_data():
    with pytest.raises(ValueError, match="split='test' picks a task's data; give task="):
        gym.make("servegym/Serving-v2", split="test")
    with pytest.raises(ValueError, match="split must be one of"):
        gym.make("servegym/Serving-v2", task="long-context", split="validation")
    test = gym.make("servegym/LongContext-v2", split="test").unwrapped
    train = gym.make("servegym/LongContext-v2").unwrapped
    assert test.workload != train.workload
    assert servegym.task_id("long-context") == "servegym/LongContext-v2"
