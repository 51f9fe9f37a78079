"""Training a researcher can trust: strict config.json from the start, best model with its own statistics,
checkpoints, resume after a kill, validation seeds apart from training seeds."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from servegym.envs.tasks import VALIDATION_SEEDS
from servegym.policies import make_policy
from servegym.rl.train import TrainConfig, latest_checkpoint, resume, train

TINY = {"n_steps": 64, "batch_size": 64, "n_epochs": 1}


def _cfg(tmp_path, **kw):
    base = dict(algo="ppo", mode="count", task="memory-tight", timesteps=256, n_envs=2, max_episode_steps=100,
                eval_freq=128, eval_episodes=2, checkpoint_freq=128, hyperparams=TINY, out=str(tmp_path))
    return TrainConfig(**{**base, **kw})


def _strict(path):
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path} holds {c}"))


@pytest.mark.slow
def test_config_is_strict_json_even_when_no_evaluation_falls_due(tmp_path):
    run = train(_cfg(tmp_path, eval_freq=10_000), progress=False, subprocess=False)
    config = _strict(run / "config.json")
    assert config["status"] == "finished" and config["timesteps_done"] == 256
    assert np.isfinite(config["best_mean_reward"])  # the final model was scored once
    assert config["validation_seeds"] == list(VALIDATION_SEEDS[:2]) and config["task"] == "memory-tight"


def test_config_is_written_before_training_starts_and_a_crash_is_recorded_as_failed(tmp_path, monkeypatch):
    import servegym.rl.train as train_module

    seen = []

    def boom(session, *args, **kwargs):
        seen.append(_strict(session.run / "config.json"))  # what a reader sees while training runs
        raise RuntimeError("killed")

    monkeypatch.setattr(train_module, "_learn", boom)
    with pytest.raises(RuntimeError, match="killed"):
        train(_cfg(tmp_path), progress=False, subprocess=False)
    assert seen[0]["status"] == "running" and seen[0]["best_mean_reward"] is None
    config = _strict(next(tmp_path.glob("*/config.json")))
    assert config["status"] == "failed" and config["error"] == "RuntimeError: killed"
    assert config["timesteps_done"] == 0 and config["last_checkpoint"] is None


@pytest.mark.slow
def test_best_model_is_saved_with_the_statistics_it_was_scored_with(tmp_path):
    run = train(_cfg(tmp_path, timesteps=512), progress=False, subprocess=False)
    config = _strict(run / "config.json")
    evals = [line.split(",") for line in (run / "eval.csv").read_text().split()]
    steps, scores = [int(s) for s, _ in evals], [float(v) for _, v in evals]
    assert steps == [128, 256, 384, 512]
    assert config["best_mean_reward"] == max(scores) and config["best_timesteps"] == steps[int(np.argmax(scores))]
    best = pickle.loads((run / "best_vecnormalize.pkl").read_bytes())
    final = pickle.loads((run / "vecnormalize.pkl").read_bytes())
    if config["best_timesteps"] != 512:  # statistics moved on after the best evaluation
        assert best.obs_rms["engine"].count < final.obs_rms["engine"].count
    policy = make_policy(f"rl:{run}")
    assert policy.model_path.name == "best_model.zip"
    assert policy._vec_normalize.obs_rms["engine"].count == best.obs_rms["engine"].count


@pytest.mark.slow
def test_killed_run_resumes_from_its_checkpoint_and_loads_as_a_policy(tmp_path):
    cfg = _cfg(tmp_path, timesteps=512)
    run = train(_cfg(tmp_path, timesteps=256), progress=False, subprocess=False)
    # Simulate a kill at 256 steps of a 512-step run: no final model, config still says running.
    for name in ("model.zip", "vecnormalize.pkl"):
        (run / name).unlink()
    config = _strict(run / "config.json")
    config.update(timesteps=512, status="running")
    (run / "config.json").write_text(json.dumps(config))
    assert latest_checkpoint(run).name == "model_256_steps.zip"
    assert make_policy(f"rl:{run}").model_path.name == "best_model.zip"  # loadable while stopped
    resume(run, progress=False, subprocess=False)
    config = _strict(run / "config.json")
    assert config["status"] == "finished" and config["timesteps_done"] == cfg.timesteps
    assert config["resumed_from"] == 256
    assert latest_checkpoint(run).name == "model_512_steps.zip"
    assert [int(line.split(",")[0]) for line in (run / "eval.csv").read_text().split()] == [128, 256, 384, 512]
    assert make_policy(f"rl:{run}").act is not None


def test_extra_env_arguments_reach_the_training_env():
    cfg = TrainConfig(task="memory-tight", env={"decision_steps": True, "reward_half_life_s": 30.0})
    kwargs = cfg.env_kwargs()
    assert kwargs["decision_steps"] is True and kwargs["task"] == "memory-tight"
    from servegym.rl.train import make_training_env

    env = make_training_env(kwargs, "rank")
    assert env.unwrapped.decision_steps and env.unwrapped.reward_half_life_s == 30.0


def test_training_into_a_used_folder_is_refused(tmp_path):
    cfg = _cfg(tmp_path)
    run = tmp_path / cfg.run_name
    run.mkdir()
    (run / "best_model.zip").write_bytes(b"old")
    with pytest.raises(ValueError, match="already holds a run"):
        train(cfg, progress=False, subprocess=False)


def test_episode_limit_is_the_envs_own_so_cutting_short_pays_the_penalty():
    from servegym.rl.train import make_training_env

    env = make_training_env({"task": "relaxed"}, "count", max_episode_steps=50, monitor=False)
    env.reset(seed=1)
    total, truncated = 0.0, False
    for _ in range(50):
        _, reward, _, truncated, _ = env.step(8)
        total += reward
    assert truncated and env.unwrapped.max_steps == 50
    assert total < -60.0 * 800  # hundreds of requests unserved after 50 steps, each charged the penalty


def test_an_agent_keeps_only_its_length_mode_on_the_task_it_is_scored_on(tmp_path):
    run = train(_cfg(tmp_path, engine={"length_mode": "predicted", "num_kv_blocks": 8192}), progress=False,
                subprocess=False)
    assert make_policy(f"rl:{run}").engine_overrides() == {"length_mode": "predicted"}


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "ppo", "task": "relaxed"}))
    with pytest.raises(ValueError, match="no checkpoint"):
        resume(run, progress=False)


@pytest.mark.parametrize(("field", "value", "match"), [("eval_episodes", 6, "eval_episodes"),
                                                       ("seed", -1, "seed"), ("task", "nope", "unknown task"),
                                                       ("checkpoint_freq", 0, "checkpoint_freq"),
                                                       ("env", {"engine": {}}, "must not hold"),
                                                       ("seed", 99_999, "seed must be in")])
def test_bad_training_configs_are_refused(field, value, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{field: value})
