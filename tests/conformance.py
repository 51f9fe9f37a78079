"""The policy conformance suite: every policy, registered or trained, must pass it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from servegym.policies import Policy
from servegym.runner import make_env, run_episode


def assert_valid_actions(make: Callable[[], Policy], workload: str = "burst", steps: int = 500) -> None:
    """Only valid actions (strict env), with request conservation and KV accounting checked every step."""
    policy = make()
    env = make_env(policy, workload=workload, strict_actions=True, engine={"check_invariants": True})
    obs, _ = env.reset(seed=0)
    policy.reset()
    for _ in range(steps):
        action = policy.act(obs)
        assert env.action_space.contains(action)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break


def assert_deterministic(make: Callable[[], Policy], workload: str = "low", seed: int = 4) -> None:
    """The same seed gives the same episode."""
    results = []
    for _ in range(2):
        policy = make()
        results.append(run_episode(make_env(policy, workload=workload, max_episode_steps=20_000), policy,
                                   seed=seed).summary)
    assert results[0] == results[1]


def assert_scored_by_evaluate_policy(make: Callable[[], Policy], workload: str = "low") -> None:
    """SB3's evaluate_policy scores the policy through its predict(), on a 2-env VecEnv."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    policy = make()
    venv = make_vec_env(lambda: make_env(policy, workload=workload, max_episode_steps=300), n_envs=2, seed=0)
    mean, _ = evaluate_policy(policy, venv, n_eval_episodes=2, deterministic=True)
    assert np.isfinite(mean) and mean < 0


def assert_conforms(make: Callable[[], Policy]) -> None:
    assert_valid_actions(make)
    assert_deterministic(make)
    assert_scored_by_evaluate_policy(make)
