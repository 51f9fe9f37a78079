"""Pins of evaluation, task and training plumbing no other test fixes: the leaderboard's place for a NaN score, stored
runs read back only under their own key (a torn file runs again), tuning's seed range and recorded sampler seed,
a task's settings reaching the env, and the training envs' disjoint seed streams."""

from __future__ import annotations

import math
import pickle

import gymnasium as gym
import numpy as np
import pytest

import servegym
from servegym.benchmark.bench import BenchRow
from servegym.benchmark.board import boards
from servegym.envs import TRAIN_SEEDS, get_task
from servegym.evaluation.executor import RunStore


# ------------------------------------------------------------------------------------------------ leaderboard
def _rows(metric: str, per_policy: dict[str, list[float]]) -> list[BenchRow]:
    base = {"episode_return": -1.0, "goodput_rps": 1.0, "e2e_mean_all_s": 1.0, "ttft_p99_s": 1.0, "unfinished": 0}
    return [BenchRow("t", policy, seed, **{**base, metric: value}, truncated=False, steps=10)
            for policy, values in per_policy.items() for seed, value in enumerate(values)]


@pytest.mark.parametrize(("metric", "values", "order"), [
    # Higher is better: -6 beats -11; the NaN policy (no finite score) goes last, not to 0 (which would win).
    ("episode_return", {"a": [-10.0, -12.0], "nan": [math.nan, math.nan], "c": [-5.0, -7.0]}, ["c", "a", "nan"]),
    # Lower is better: 1 beats 3; NaN still goes last, not to 0 (which would win again).
    ("e2e_mean_all_s", {"a": [3.0, 3.0], "nan": [math.nan, math.nan], "c": [1.0, 1.0]}, ["c", "a", "nan"]),
])
def test_leaderboard_ranks_a_nan_score_last_whatever_the_direction(metric, values, order):
    (board,) = boards(_rows(metric, values), rankings={"t": metric})
    assert [score.policy for score in board.scores] == order
    assert math.isnan(board.scores[-1].mean(metric))


# ------------------------------------------------------------------------------------------------ run store
def test_a_truncated_run_file_is_run_again_not_an_error(tmp_path):
    # Rule: a stored run that cannot be read back (a file cut short by a kill: EOFError or UnpicklingError) is
    # missing, so resuming runs that job again.
    store = RunStore(tmp_path)
    store.put(("fcfs", 0), {"x": 1.0})
    path = next(tmp_path.glob("*.pkl"))
    whole = path.read_bytes()
    for cut in (b"", whole[:1], whole[: len(whole) // 2]):
        path.write_bytes(cut)
        assert store.get(("fcfs", 0)) is None, f"{len(cut)} of {len(whole)} bytes"
    with pytest.raises(EOFError):
        pickle.loads(b"")  # the empty file is the EOFError case


def test_a_stored_run_is_read_back_only_under_its_own_key(tmp_path):
    # Rule: a result is returned only for the key it was stored under (its file holds repr(key)); a file that
    # carries another key, e.g. one copied or left from another grid, is ignored.
    store = RunStore(tmp_path)
    store.put(("twp", 1), {"x": 2.0})
    store.put(("twp", 2), {"x": 3.0})
    assert store.get(("twp", 1)) == {"x": 2.0} and store.get(("twp", 2)) == {"x": 3.0}
    store._file(("twp", 2)).write_bytes(store._file(("twp", 1)).read_bytes())
    assert store.get(("twp", 2)) is None
    assert store.get(("twp", 1)) == {"x": 2.0}


# ------------------------------------------------------------------------------------------------ tuning
def test_tuning_episodes_use_their_own_seed_range(monkeypatch):
    # Rule: trial k's episodes run on seeds TUNING_SEED_BASE + 0 .. seeds - 1 (10000..), inside TRAIN_SEEDS and
    # apart from the evaluation seeds 0..eval_seeds - 1 that the default-vs-tuned comparison uses.
    optuna = pytest.importorskip("optuna")
    from servegym.tuning import study as tuning
    from servegym.workloads import make_workload

    seen: list[int] = []

    def fake_evaluate(policy, params, workload, seeds, max_steps, env=None, checkpoint=None):
        seen.extend(seeds)
        return [{"goodput_rps": 1.0}]

    monkeypatch.setattr(tuning, "evaluate", fake_evaluate)
    cfg = tuning.TuneConfig(policy="flow-control", workload="low", seeds=3, eval_seeds=5)
    run = tuning.objective_function(cfg, tuning.get_objective("goodput"), make_workload("low"))
    run(optuna.trial.FixedTrial({"activation_budget": 2.0}))
    assert seen == [10_000, 10_001, 10_002]
    assert all(seed in TRAIN_SEEDS for seed in seen) and not set(seen) & set(range(cfg.eval_seeds))


def test_tune_without_a_sampler_seed_records_the_one_it_drew(tmp_path, monkeypatch):
    # Rule: a worker without --sampler-seed draws one (fresh_seed) and both seeds its sampler with it and records it
    # on every trial, so a run can be reproduced from the study.
    optuna = pytest.importorskip("optuna")
    from servegym.tuning import study as tuning

    drawn: list[int] = []

    def fresh_seed() -> int:
        drawn.append(123_456_789 + len(drawn))
        return drawn[-1]

    samplers: list[int | None] = []
    real_tpe = optuna.samplers.TPESampler

    def tpe(seed=None, **kwargs):
        samplers.append(seed)
        return real_tpe(seed=seed, **kwargs)

    monkeypatch.setattr(tuning, "fresh_seed", fresh_seed)
    monkeypatch.setattr(optuna.samplers, "TPESampler", tpe)
    cfg = tuning.TuneConfig(policy="flow-control", workload="low", trials=2, seeds=1, max_steps=30, pruner="none",
                            storage=f"sqlite:///{tmp_path}/s.db")
    study = tuning.tune(cfg, progress=False)
    assert drawn == [123_456_789], "one seed drawn per worker"
    assert samplers == drawn
    assert [t.user_attrs["sampler_seed"] for t in study.trials] == drawn * 2


# ------------------------------------------------------------------------------------------------ tasks
def test_a_tasks_settings_reach_the_env_with_the_callers_on_top():
    # Rule: gym.make(task=T, **kwargs) builds the env from T's workload, profile, engine, pool, reward and limits;
    # the caller's arguments win, and engine/pool dicts merge key by key.
    task = get_task("serverless-burst")
    env = gym.make(servegym.ENV_ID, task=task.name, engine={"num_kv_blocks": 500}, pool={"keep_alive_s": 9.0},
                   max_steps=77).unwrapped
    assert (env.reward_name, env.idle_guard_steps, env.max_steps) == (task.reward, 200, 77)
    assert env.engine_config.length_mode.value == "predicted" and env.engine_config.num_kv_blocks == 500
    pool = env.pool_config
    assert (pool.num_containers, pool.keep_alive_s, pool.start_cold) == (4, 9.0, True)
    env.close()
    tight = gym.make(servegym.ENV_ID, task="memory-tight").unwrapped
    assert tight.max_steps == 20_000 and tight.idle_guard_steps == 200
    from servegym.backends import load_profile

    assert tight.cluster.engines[0].num_kv_blocks == load_profile("a40-llama2-7b").num_kv_blocks
    tight.close()
    slo = gym.make(servegym.ENV_ID, task="slo-goodput", reward="latency", idle_guard_steps=None).unwrapped
    assert (slo.reward_name, slo.idle_guard_steps) == ("latency", None)  # the caller's None overrides too
    slo.close()


# ------------------------------------------------------------------------------------------------ training seeds
def test_training_envs_draw_disjoint_seed_streams():
    # Rule: with --seed s and n envs, env r resets on TRAIN_SEEDS[s * 10007 + offset + r + k n] for k = 0, 1, ...:
    # interleaved streams, so no two envs (and no later offset's envs) replay one episode.
    pytest.importorskip("stable_baselines3")
    from servegym.rl.train import TrainConfig, _vec_env
    from servegym.rl.wrappers import TrainSeeds

    cfg = TrainConfig(algo="ppo", workload="low", seed=2, n_envs=3, max_episode_steps=5)
    venv = _vec_env(cfg, subprocess=False, offset=4)
    try:
        streams = []
        for env in venv.envs:
            while not isinstance(env, TrainSeeds):
                env = env.env
            seeds = []
            for _ in range(3):
                env.reset()
                seeds.append(env.last_seed)
            streams.append(seeds)
    finally:
        venv.close()
    start = 2 * 10_007 + 4
    assert streams == [[start + r + k * 3 for k in range(3)] for r in range(3)]
    assert len(set(np.ravel(streams).tolist())) == 9
