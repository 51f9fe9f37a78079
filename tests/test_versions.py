"""Serving-v2 with the legacy v1 and v0, one id per task, and the held-out test data of trace tasks (issue 26; the
independence of test episodes, issue 51, is in test_test_episodes.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import servegym
from servegym.envs import TASKS, TEST_SEEDS, VALIDATION_SEEDS
from servegym.envs.mixture import V1_TRUNCATION_PENALTY_S
from servegym.workloads import make_workload
from servegym.workloads.scenarios import TEST_SPANS, TRAIN_SPANS, V2_TEST_SPANS, V2_TRAIN_SPANS
from servegym.workloads.trace import _read


def test_every_task_has_its_own_current_id_and_every_version_loads():
    assert set(servegym.TASK_IDS) == set(TASKS)
    for task, name in servegym.TASK_IDS.items():
        env = gym.make(f"servegym/{name}-v2")
        direct = gym.make(servegym.ENV_ID, task=task)
        assert env.observation_space == direct.observation_space and env.action_space == direct.action_space
        env.close()
        direct.close()
    assert servegym.ENV_ID == "servegym/Serving-v2" and max(servegym.ENV_CHANGES) == servegym.VERSION == 2
    assert gym.make(servegym.ENV_IDS[1], task="relaxed").unwrapped.truncation_penalty_s == 600.0
    legacy = gym.make(servegym.LEGACY_ENV_ID, task="relaxed")
    assert legacy.unwrapped.truncation_penalty_s == 60.0
    assert gym.make(servegym.ENV_ID, task="relaxed").unwrapped.truncation_penalty_s == V1_TRUNCATION_PENALTY_S == 600.0
    with pytest.raises(ValueError, match="split must be one of"):
        gym.make(servegym.ENV_ID, task="relaxed", split="validation")


def test_trace_tasks_train_on_one_part_and_test_on_the_held_out_rest():
    def spans(version, split):
        return gym.make(servegym.ENV_IDS[version], task="long-context", split=split).unwrapped.workload.spans

    assert (spans(2, "train"), spans(2, "test")) == (V2_TRAIN_SPANS, V2_TEST_SPANS)
    assert (spans(1, "train"), spans(1, "test"), spans(0, "test")) == (TRAIN_SPANS, TEST_SPANS, ((0.0, 1.0),))
    assert TRAIN_SPANS == ((0.0, 0.35), (0.65, 1.0)) and TEST_SPANS == ((0.35, 0.65),)
    assert V2_TRAIN_SPANS == ((0.0, 0.325), (0.675, 1.0)) and V2_TEST_SPANS == ((0.325, 0.675),)
    mixture = gym.make(servegym.ENV_ID, task="mixture", split="test").unwrapped
    assert mixture.components["long-context"].workload.spans == V2_TEST_SPANS
    for name in ("prefix-reuse", "cluster-routing"):
        test = gym.make(servegym.ENV_ID, task=name, split="test").unwrapped
        test = getattr(test, "serving", test).workload
        v1 = gym.make(servegym.ENV_IDS[1], task=name, split="test").unwrapped
        assert (test.spans, test.tiles, getattr(v1, "serving", v1).workload.spans) == (V2_TEST_SPANS, True, TEST_SPANS)


def test_no_test_window_shares_a_request_with_any_training_or_validation_window():
    # Serving-v1's long-context windows, rows [lo, hi) of the bundled trace: the test windows (every test seed) lie
    # in the rows of the middle 35-65% of its time range, and every training window (2,000 training seeds and the
    # validation seeds) lies wholly before or wholly after those rows; training windows come from both sides.
    train, test = make_workload("azure-code-window-train"), make_workload("azure-code-window-test")
    full = _read(train.path)
    held_lo, held_hi = np.searchsorted(full.arrival_s, [0.35 * full.arrival_s[-1], 0.65 * full.arrival_s[-1]])
    train_rows = [train.window_rows(full, np.random.default_rng(s)) for s in (*range(2000), *VALIDATION_SEEDS)]
    test_rows = [test.window_rows(full, np.random.default_rng(s)) for s in TEST_SEEDS]
    assert all(held_lo <= lo < hi <= held_hi for lo, hi in test_rows)
    assert all(hi <= held_lo or lo >= held_hi for lo, hi in train_rows)
    assert any(hi <= held_lo for _, hi in train_rows) and any(lo >= held_hi for lo, _ in train_rows)
    assert all(hi - lo >= train.min_requests for lo, hi in (*train_rows, *test_rows))


def test_a_span_is_checked():
    from servegym.workloads.trace import TraceWorkload

    path = make_workload("azure-code-window").path
    with pytest.raises(ValueError, match="spans must be disjoint fractions"):
        TraceWorkload(path, duration_s=120.0, random_window=True, spans=((0.8, 0.7),))
    with pytest.raises(ValueError, match="spans must be disjoint fractions"):
        TraceWorkload(path, duration_s=120.0, random_window=True, spans=((0.0, 0.5), (0.4, 0.9)))
    with pytest.raises(ValueError, match="spans need random_window"):
        TraceWorkload(path, duration_s=120.0, spans=((0.0, 0.5),))
    with pytest.raises(ValueError, match="shorter than"):
        TraceWorkload(path, duration_s=120.0, random_window=True, spans=((0.99, 1.0),)).sample(
            np.random.default_rng(0))


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(name for name, task in TASKS.items() if task.decision == "admission"))
def test_never_admitting_ranks_below_fcfs_on_every_test_seed(task):
    # v1's truncation charge (600 s per unserved request) makes stalling until the idle guard ends the episode
    # lose to FCFS on every seed; v0's 60 s let it tie FCFS on a heavy long-context window (-51,223 vs -50,914).
    from servegym.policies import make_policy
    from servegym.runner import make_env, run_episode

    for seed in TASKS[task].test_seeds:
        returns = {}
        for name, params in (("fcfs", {}), ("random", {"admit_probability": 0.0})):
            policy = make_policy(name, **params)
            env = make_env(policy, task=task, split="test", apply_overrides=False)
            returns[name] = run_episode(env, policy, seed).total_reward
            env.close()
        assert returns["random"] < returns["fcfs"], (seed, returns)
