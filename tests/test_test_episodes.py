"""Independent test episodes (issue 51): no request in two test episodes of a task, nor in any training or validation
episode; the same seed gives the same episode; Serving-v1's episodes are unchanged."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils import seeding

import servegym
from servegym.envs import TASKS, TEST_SEEDS, VALIDATION_SEEDS
from servegym.envs.mixture import make_serving_env
from servegym.envs.tasks import MIXTURE_TEST_SEEDS, TILED_TEST_SEEDS
from servegym.workloads import make_workload
from servegym.workloads.trace import TraceError, TraceWorkload, bundled_trace, episode_tile

TRACE_TASKS = sorted(name for name, task in TASKS.items() if task.test_workload)
"""The tasks whose test episodes replay held-out trace data (the others draw every request afresh)."""
TRAINING_SEEDS = (*range(2000), *VALIDATION_SEEDS)


def _rows(workload, seed: int) -> np.ndarray:
    return workload.episode_rows(np.random.default_rng(seed))


@pytest.mark.parametrize("name", TRACE_TASKS)
def test_no_request_is_in_two_test_episodes_or_in_training(name):
    # Catches overlapping or shifted tiles, a tile picked by a draw (two seeds on one tile), a held-out span that
    # reaches into the training spans, and a session split across the train/test boundary.
    task = TASKS[name]
    test, train = make_workload(task.test_workload), make_workload(task.workload)
    episodes = [_rows(test, seed) for seed in task.test_seeds]
    held = np.concatenate(episodes)
    assert all(len(rows) >= test.min_requests for rows in episodes)
    assert np.unique(held).size == held.size  # pairwise disjoint
    trained = np.unique(np.concatenate([_rows(train, seed) for seed in TRAINING_SEEDS]))
    assert not np.intersect1d(held, trained).size
    session = train.read().session
    if session is not None:  # Mooncake: a session lies wholly on one side of the split
        assert not np.intersect1d(session[held], session[trained]).size


@pytest.mark.parametrize("name", TRACE_TASKS)
def test_a_trace_task_reports_on_as_many_seeds_as_its_held_out_data_holds_tiles(name):
    # Catches test seeds that outnumber the tiles (later seeds would replay earlier tiles) or a tiling that changed
    # under the task's seeds.
    task = TASKS[name]
    assert task.test_seeds == TILED_TEST_SEEDS == TEST_SEEDS[:10]
    assert make_workload(task.test_workload).num_tiles() == len(task.test_seeds)


def test_tasks_drawn_afresh_report_on_every_test_seed_and_the_mixture_on_27():
    # Catches a synthetic task cut short, and a mixture whose seeds would replay a long-context tile twice.
    for name, task in TASKS.items():
        if not task.test_workload and not task.is_mixture:
            assert task.test_seeds == TEST_SEEDS, name
    assert TASKS["mixture"].test_seeds == MIXTURE_TEST_SEEDS and len(MIXTURE_TEST_SEEDS) == 27


def test_the_mixtures_long_context_test_episodes_share_no_request():
    # Through the env: the mixture draws its component from the seed and the component replays the seed, so the
    # mixture's test seeds must not put two long-context episodes on one tile. Catches a seed list that does.
    env = make_serving_env("mixture", "test")
    workload = env.components["long-context"].workload
    long_context = []
    for seed in MIXTURE_TEST_SEEDS:
        _, info = env.reset(seed=seed)
        if info["task"] == "long-context":
            long_context.append(_rows(workload, seed))
            spec = workload.sample(np.random.default_rng(seed))
            np.testing.assert_array_equal(env.current.cluster.log.arrival_s, spec.arrival_s)
    rows = np.concatenate(long_context)
    assert len(long_context) == 7 and np.unique(rows).size == rows.size


@pytest.mark.parametrize("name", TRACE_TASKS)
def test_the_env_replays_the_tile_its_seed_names(name):
    # Catches a draw from the episode's generator before the workload's (the tile would then be drawn, not read off
    # the seed), and a reset that does not give the same seed the same episode.
    env = gym.make(servegym.ENV_ID, task=name, split="test").unwrapped
    workload = make_workload(TASKS[name].test_workload)
    serving = getattr(env, "serving", env)
    for seed in TILED_TEST_SEEDS[:3]:
        spec = workload.sample(np.random.default_rng(seed))
        for _ in range(2):
            env.reset(seed=seed)
            np.testing.assert_array_equal(serving.cluster.log.arrival_s, spec.arrival_s)
            np.testing.assert_array_equal(serving.cluster.log.num_prompt_tokens, spec.num_prompt_tokens)


def test_a_tile_is_read_off_the_seed_only_while_the_generator_is_fresh():
    # Catches reading the seed off a generator that has drawn already: every unseeded reset after the first would
    # replay the same tile.
    for seed in (900_000, 900_007, 3):
        assert episode_tile(np.random.default_rng(seed), 10) == seed % 10
        assert episode_tile(seeding.np_random(seed)[0], 10) == seed % 10
        assert episode_tile(np.random.default_rng(np.int64(seed)), 10) == seed % 10
    used = np.random.default_rng(900_000)
    used.random()
    assert {episode_tile(used, 10) for _ in range(30)} != {0}
    assert episode_tile(np.random.default_rng([1, 2]), 10) in range(10)  # not one integer: drawn


def test_v1_and_v0_replay_exactly_the_windows_they_always_did():
    # (rows, first row, last row, sum of rows) of the trace, computed before the tiles existed. Catches v1 or v0
    # switched to v2's workloads, and any change to how random windows are drawn.
    expected = {
        ("long-context", "train"): {0: (425, 7544, 7968, 3296300), 900_000: (209, 717, 925, 171589)},
        ("long-context", "test"): {7: (343, 5616, 5958, 1984941), 900_000: (129, 3744, 3872, 491232),
                                   900_029: (716, 4106, 4821, 3195866)},
        ("prefix-reuse", "train"): {0: (371, 79, 1838, 360665), 900_029: (374, 7702, 9888, 3309593)},
        ("prefix-reuse", "test"): {0: (341, 4223, 6270, 1804099), 900_000: (349, 4199, 6250, 1833272)},
        ("cluster-routing", "train"): {7: (1030, 10574, 11665, 11455401), 100_000: (936, 1286, 2221, 1641276)},
        ("cluster-routing", "test"): {0: (891, 5457, 6475, 5324999), 900_029: (798, 4304, 5313, 3852279)},
    }
    for (name, split), fingerprints in expected.items():
        workload = make_workload(TASKS[name].workload_for(split, 1))
        for seed, fingerprint in fingerprints.items():
            rows = _rows(workload, seed)
            assert (len(rows), rows[0], rows[-1], rows.sum()) == fingerprint, (name, split, seed)
    legacy = make_workload(TASKS["long-context"].workload_for("test", 0))
    rows = _rows(legacy, 900_000)
    assert (len(rows), rows[0], rows[-1], rows.sum()) == (852, 2045, 2896, 2104866)


def test_a_tiling_is_checked():
    path = str(bundled_trace())
    with pytest.raises(ValueError, match="tiles need random_window and exactly one span"):
        TraceWorkload(path, duration_s=120.0, random_window=True, spans=((0.0, 0.3), (0.6, 0.9)), tiles=True)
    with pytest.raises(ValueError, match="tiles need random_window"):
        TraceWorkload(path, duration_s=120.0, tiles=True)
    short = TraceWorkload(path, duration_s=120.0, random_window=True, spans=((0.5, 0.52),), tiles=True)
    with pytest.raises(TraceError, match="shorter than a 120 s tile"):
        short.sample(np.random.default_rng(0))
    sparse = TraceWorkload(path, duration_s=1.0, random_window=True, min_requests=50, spans=((0.5, 0.6),), tiles=True)
    with pytest.raises(TraceError, match="holds fewer than 50 requests"):
        sparse.sample(np.random.default_rng(0))
    with pytest.raises(ValueError, match="tile must be in"):
        sparse.window_rows(sparse.read(), np.random.default_rng(0), tile=sparse.num_tiles())
