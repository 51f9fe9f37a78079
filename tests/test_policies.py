"""The policy interface, the registry, and a conformance suite over every registered policy."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.envs import queue_matrix
from servegym.policies import Policy, deciding, make_policy, register_policy
from servegym.runner import make_env
from servegym.workloads import WORKLOADS
from tests.conformance import assert_deterministic, assert_scored_by_evaluate_policy, assert_valid_actions
from tests.conftest import fixed

ALL = deciding("admission")
"""The admission policies (the routers have their own suite: tests/test_routers.py)."""


def test_registry_refuses_duplicates_and_nameless_policies():
    class Again(Policy):
        name, source, rule = "fcfs", "x", "y"

        def act(self, obs):
            return np.zeros(32, dtype=np.int64)

    with pytest.raises(ValueError, match="already registered"):
        register_policy(Again)

    class Nameless(Policy):
        def act(self, obs):
            return np.zeros(32, dtype=np.int64)

    with pytest.raises(ValueError, match="must set name"):
        register_policy(Nameless)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope")


@pytest.mark.parametrize("name", ALL)
def test_policy_emits_only_valid_actions(name):
    assert_valid_actions(lambda: make_policy(name))


@pytest.mark.parametrize("name", ALL)
def test_policy_is_deterministic(name):
    assert_deterministic(lambda: make_policy(name))


@pytest.mark.parametrize("name", ALL)
def test_policy_works_with_sb3_evaluate_policy(name):
    assert_scored_by_evaluate_policy(lambda: make_policy(name))


def test_fcfs_admits_in_arrival_order_while_kv_allows():
    # 6 requests of 100-token prompts need 7 blocks each (prompt + first token); 20 blocks hold two.
    policy = make_policy("fcfs")
    env = make_env(policy, workload=fixed(np.zeros(6), np.full(6, 100), np.full(6, 50)),
                   engine={"num_kv_blocks": 20, "block_size": 16})
    obs, _ = env.reset(seed=0)
    action = policy.act(obs)
    assert action[:2].tolist() == [1, 1] and not action[2:].any()
    obs, _, _, _, info = env.step(action)
    assert info["num_admitted"] == 2 and info["num_refused"] == 0
    assert env.unwrapped.engine.waiting.tolist() == [2, 3, 4, 5]
    assert queue_matrix(obs)[0, 0] == 100


def test_fcfs_never_skips_ahead():
    # The head (a 300-token prompt) does not fit; FCFS must not admit the small request behind it.
    policy = make_policy("fcfs")
    env = make_env(policy, workload=fixed([0.0, 0.0, 0.0], [150, 300, 10], [100, 5, 5]),
                   engine={"num_kv_blocks": 20, "block_size": 16})
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(policy.act(obs))
    for _ in range(3):
        action = policy.act(obs)
        assert not action.any()
        obs, *_ = env.step(action)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("name", ALL)
def test_every_policy_runs_on_every_workload(name, workload):
    policy = make_policy(name)
    # Mooncake prompts average 12-15k tokens: a policy with small prefill chunks (TWP) needs hundreds of steps
    # before a first request completes.
    steps = 3000 if workload.startswith("mooncake") else 300
    env = make_env(policy, workload=workload, strict_actions=True, max_episode_steps=steps)
    obs, _ = env.reset(seed=0)
    for _ in range(steps):
        obs, _, terminated, truncated, _ = env.step(policy.act(obs))
        if terminated or truncated:
            break
    assert env.unwrapped.engine.num_finished > 0
