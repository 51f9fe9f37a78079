"""TWP in a pool: one controller per container by default, the shared one as an option; B0 from the profile."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from servegym.policies.twp import DEFAULT_B0, TokenWindowPacing, TWPParams, deciding_container
from servegym.runner import make_env
from tests.conftest import fixed, flat_profile


def pool_run(policy: TokenWindowPacing, steps: int = 600) -> list[dict[str, np.ndarray]]:
    """Drive a warm 2-container pool on a steep profile (ITL grows with the batch, so the two engines' ITLs
    differ); returns the observations container 0 decided on, in order."""
    n = 400
    workload = fixed(np.linspace(0.0, 20.0, n), np.full(n, 30), np.full(n, 60))
    env = make_env(policy, workload=workload, profile=flat_profile(alpha_s=0.01, saturation_batch=2),
                   engine={"length_mode": "known"}, pool={"num_containers": 2})
    obs, _ = env.reset(seed=0)
    policy.reset()
    seen = []
    for _ in range(steps):
        if deciding_container(obs) == 0:
            seen.append(copy.deepcopy(obs))
        obs, _, terminated, truncated, _ = env.step(policy.act(obs))
        if terminated or truncated:
            break
    env.close()
    return seen


def replay_window(observations: list[dict[str, np.ndarray]], **params) -> np.ndarray:
    """The windows a fresh TWP computes from ``observations`` alone (one engine's own feedback)."""
    alone = TokenWindowPacing(**params)
    alone.bind_profile(flat_profile(alpha_s=0.01, saturation_batch=2))
    for obs in observations:
        alone.act(obs)
    return alone.diagnostics()["window"]


PARAMS = {"max_wait_steps": 10**6}


def test_each_container_has_its_own_controller():
    # Container 0's windows in the pool equal those of a TWP that sees container 0's observations alone:
    # container 1's ITLs and KV use never reach container 0's window, ITL filter, l_min or KV guard.
    policy = TokenWindowPacing(**PARAMS)
    seen = pool_run(policy)
    d = policy.diagnostics()
    mine = d["container"] == 0
    assert set(np.unique(d["container"]).tolist()) == {0.0, 1.0}
    assert mine.sum() == len(seen) > 100
    expected = replay_window(seen, **PARAMS)
    print(f"container 0: {mine.sum()} steps, window {d['window'][mine].min():.1f}..{d['window'][mine].max():.1f}")
    np.testing.assert_allclose(d["window"][mine], expected, rtol=1e-12)


def test_shared_controller_mixes_the_containers_feedback():
    # The option keeps one controller for both engines: container 0's windows then depend on container 1's
    # steps, so they differ from container 0's own replay, and the window moves between consecutive steps of
    # different containers (the zig-zag).
    policy = TokenWindowPacing(shared_controller=True, **PARAMS)
    seen = pool_run(policy)
    d = policy.diagnostics()
    mine = d["container"] == 0
    alone = replay_window(seen, **PARAMS)
    gap = np.abs(d["window"][mine] - alone).max()
    print(f"shared vs own replay: largest window gap {gap:.1f} tokens")
    assert gap > 1.0
    switches = np.flatnonzero(np.diff(d["container"]) != 0)
    assert switches.size > 50


def test_b0_comes_from_the_profile_and_an_explicit_value_wins():
    # paper-v100-llama3.2-3b (schema 1) states B0 = 8; a100-llama3-8b (schema 2) gives its derived saturation
    # batch, 20. An explicit value, or None (no floor), is kept; without a profile (never bound) B0 is 8.
    workload = fixed([0.0], [10], [5])
    for profile, b0 in (("paper-v100-llama3.2-3b", 8), ("a100-llama3-8b", 20)):
        policy = TokenWindowPacing()
        make_env(policy, workload=workload, profile=profile).close()
        assert policy.min_active_requests == b0, profile
        assert policy._window_floor(100.0, np.zeros(0)) == 100.0 * b0
    for explicit in (5, None):
        policy = TokenWindowPacing(min_active_requests=explicit)
        make_env(policy, workload=workload, profile="a100-llama3-8b").close()
        assert policy.min_active_requests == explicit
    assert TokenWindowPacing().min_active_requests == DEFAULT_B0 == 8


def test_b0_from_the_profile_reaches_the_window_floor_in_a_run():
    # On a100-llama3-8b with known lengths the floor is 20 x the running requests' mean remaining tokens.
    policy = TokenWindowPacing()
    env = make_env(policy, workload=fixed(np.zeros(30), np.full(30, 20), np.full(30, 40)), profile="a100-llama3-8b",
                   engine={"length_mode": "known"})
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(policy.act(obs))
    env.close()
    floor = policy.diagnostics()["window_floor"]
    # Step 0: nothing runs, 30 waiting requests of 40 tokens: 20 x 40 = 800 (8 would give 320).
    assert floor[0] == pytest.approx(800.0, rel=1e-9)


@pytest.mark.parametrize(("name", "value"), [("min_active_requests", "auto"), ("min_active_requests", 0),
                                             ("shared_controller", "no")])
def test_bad_values_are_refused_with_the_name(name, value):
    with pytest.raises(ValueError, match=name):
        TWPParams(**{name: value})


def test_the_grid_plots_container_zeros_controller_beside_container_zeros_log(tmp_path):
    # Rule: the TWP feedback series (window beside the step log's batch and queue) is container 0's alone; in a
    # pool TWP's diagnostics interleave both containers' rows, which must not be lined up with log.steps(0).
    from servegym.evaluation import run_task, tasks
    from servegym.evaluation.spec import load_experiment

    spec = tmp_path / "pool.yaml"
    spec.write_text("name: pool\nseeds: 1\nmax_steps: 600\nengine: {length_mode: predicted}\n"
                    "pool: {num_containers: 2, router: round_robin}\npolicies: [twp]\nworkloads: [medium]\n")
    result = run_task(tasks(load_experiment(spec))[0])
    assert result.series and np.all(result.series["container"] == 0)
    assert len(result.series["window"]) == len(result.series["time_s"]) > 50
