"""A pool of several containers runs the iterations that hold no decision in its own loop (``Cluster.skip``), booked
in bulk by ``ServingEnv._account_run``: every step, reward, observation and info must be what stepping each
iteration gives, whatever the reward, discount, limit, router or guard, and the loop must actually run."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import servegym
from servegym.pool import Cluster
from servegym.rl.train import make_training_env
from tests.conftest import PAPER, fixed

SERVERLESS = {"num_containers": 3, "keep_alive_s": 0.5, "cold_start_s": 0.3, "start_cold": True}


def play(env: gym.Env, engine_loop: bool, steps: int, seed: int, admit: str) -> tuple[list, int]:
    """The transitions of ``steps`` steps (resetting at episode ends), and how many pool iterations ran as single
    steps (``Cluster.step`` calls)."""
    serving = getattr(env.unwrapped, "serving", env.unwrapped)
    serving._engine_loop = engine_loop
    calls = [0]
    step = Cluster.step

    def counted(self, order):
        calls[0] += 1
        return step(self, order)

    transitions = []
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    env.action_space.seed(seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Cluster, "step", counted)
        for _ in range(steps):
            if admit == "all":
                action = np.ones(serving.queue_window, dtype=np.int64)
            elif admit == "random":
                action = rng.integers(0, 2, serving.queue_window)
            else:
                action = env.action_space.sample()
            obs, reward, terminated, truncated, info = env.step(action)
            transitions.append((obs, reward, terminated, truncated, info))
            if terminated or truncated:
                obs, info = env.reset()
                transitions.append((obs, info))
    return transitions, calls[0]


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        assert len(x) == len(y), k
        for u, v in zip(x, y, strict=True):
            if isinstance(u, dict):
                assert u.keys() == v.keys(), k
                for key in u:
                    np.testing.assert_array_equal(np.asarray(u[key], dtype=object), np.asarray(v[key], dtype=object),
                                                  err_msg=f"step {k}, {key}")
            else:
                np.testing.assert_array_equal(u, v, err_msg=f"step {k}")  # floats to the bit


@pytest.mark.parametrize(("reward", "extra"), [
    ("latency", {}),
    ("latency", {"reward_half_life_s": 3.0, "max_steps": 900, "idle_guard_steps": 40}),
    ("tokens", {"max_steps": 700}),
    ("slo_goodput", {"ttft_slo_s": 0.5, "itl_slo_s": 0.05}),
])
def test_a_serverless_pool_steps_the_same_with_its_own_loop(reward, extra):
    def make():
        return gym.make(servegym.ENV_ID, workload="burst", profile=PAPER, pool=SERVERLESS, decision_steps=True,
                        reward=reward, **extra)

    looped, looped_calls = play(make(), True, 400, 5, "random")
    stepped, stepped_calls = play(make(), False, 400, 5, "random")
    assert_same(looped, stepped)
    assert looped_calls < 0.55 * stepped_calls  # about one iteration a step outside the loop, the rest in it
    iterations = sum(t[4]["num_iterations"] for t in stepped if len(t) == 5)
    assert stepped_calls == iterations


def test_a_run_that_leaves_the_pool_idle_ends_on_the_container_that_ran():
    # Two containers; a request runs alone on container 0 until it finishes, and the next arrives 100 s later. The
    # loop runs its decode iterations; after the finish the pool is idle and container 1 (the earlier clock) decides
    # next, so the run ends there: its last iteration is container 0's, with the finish, whose SLO is counted
    # (read from container 1 it would not be). Container 1 then idles to the next arrival, the step's last.
    def make():
        return gym.make(servegym.ENV_ID, workload=fixed([0.0, 100.0], [10, 10], [40, 5]), profile=PAPER,
                        pool={"num_containers": 2}, decision_steps=True, ttft_slo_s=1e9, itl_slo_s=1e9)

    looped, _ = play(make(), True, 4, 0, "all")
    stepped, _ = play(make(), False, 4, 0, "all")
    first = looped[0][4]
    assert first["num_iterations"] == 41 and first["num_finished"] == 1 and first["container"] == 1
    assert first["num_slo_good"] == 1
    assert_same(looped, stepped)


@pytest.mark.parametrize("limit", [45, 118, 163])
def test_a_limit_inside_a_run_truncates_where_stepping_does(limit):
    # Admitting everything leaves long runs of decode-only iterations: a limit falls inside one.
    def make():
        return gym.make(servegym.ENV_ID, workload="burst", profile=PAPER, pool=SERVERLESS, decision_steps=True,
                        max_steps=limit)

    looped, _ = play(make(), True, 120, 1, "all")
    stepped, _ = play(make(), False, 120, 1, "all")
    assert_same(looped, stepped)
    ends = [k for k, t in enumerate(looped) if len(t) == 5 and t[3]]
    assert ends and looped[ends[0]][4]["num_iterations"] > 1  # the limit ended a run
    assert sum(t[4]["num_iterations"] for t in looped[: ends[0] + 1]) == limit


def test_the_route_env_steps_the_same_with_its_own_loop():
    looped, looped_calls = play(make_training_env({"task": "cluster-routing"}, "route"), True, 120, 2, "sample")
    stepped, stepped_calls = play(make_training_env({"task": "cluster-routing"}, "route"), False, 120, 2, "sample")
    assert_same(looped, stepped)
    assert looped_calls < stepped_calls / 10
