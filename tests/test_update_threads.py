"""Torch threads per training phase (``TrainConfig.update_threads``, ``servegym.rl.threads.UpdateThreads``): each
gradient update with the update threads, rollouts and everything after with the training process's one."""

from __future__ import annotations

import json

import pytest

from servegym.rl.config import TrainConfig

torch = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")


def test_the_update_runs_with_its_threads_and_the_rollouts_with_one():
    # Rule: SB3 calls on_rollout_end just before train() and on_rollout_start after it. The thread count each
    # rollout forward pass and each update forward pass sees is recorded; 3 against 1, so neither default passes.
    from stable_baselines3 import PPO

    from servegym.rl.fast_dist import policy_for
    from servegym.rl.threads import UpdateThreads
    from servegym.rl.train import make_training_env
    from servegym.rl.vec_env import NativeVecEnv

    venv = NativeVecEnv([lambda: make_training_env({"task": "memory-tight", "decision_steps": True}, "score", 200)])
    model = PPO(policy_for("ppo", venv.action_space, "score"), venv, n_steps=32, batch_size=16, n_epochs=1, seed=0)
    seen: dict[str, set[int]] = {"rollout": set(), "update": set()}
    for name, phase in (("forward", "rollout"), ("evaluate_actions", "update")):
        inner = getattr(model.policy, name)

        def wrapped(*args, _inner=inner, _phase=phase, **kwargs):
            seen[_phase].add(torch.get_num_threads())
            return _inner(*args, **kwargs)

        setattr(model.policy, name, wrapped)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        model.learn(64, callback=UpdateThreads(3, 1))  # two rollouts, two updates
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
        venv.close()
    assert seen == {"rollout": {1}, "update": {3}} and after == 1


def test_the_default_is_one_thread_and_the_run_records_its_count(tmp_path):
    assert TrainConfig(task="memory-tight").update_threads == 1  # a busy core makes more threads 2.3x slower
    assert TrainConfig(task="memory-tight", update_threads=3).update_threads == 3
    with pytest.raises(ValueError, match="update_threads must be a whole number in"):
        TrainConfig(task="memory-tight", update_threads=0)
    from servegym.rl.train import _write_config

    _write_config(tmp_path, TrainConfig(task="memory-tight", update_threads=3), {})
    assert json.loads((tmp_path / "config.json").read_text())["update_threads"] == 3


def test_an_update_that_fails_leaves_the_process_at_its_rollout_threads(tmp_path, monkeypatch):
    # The update runs with 3 threads and raises: servegym train reports the error, and the process is back at its
    # one rollout thread (on_training_end never comes after an exception).
    from stable_baselines3 import PPO

    from servegym.rl.train import train

    def failing_update(self):
        assert torch.get_num_threads() == 3  # the callback set the update's threads
        raise RuntimeError("update failed")

    monkeypatch.setattr(PPO, "train", failing_update)
    cfg = TrainConfig(algo="ppo", mode="count", workload="low", timesteps=64, n_envs=1, max_episode_steps=50,
                      hyperparams={"n_steps": 32, "batch_size": 16}, update_threads=3, out=str(tmp_path))
    before = torch.get_num_threads()
    try:
        with pytest.raises(RuntimeError, match="update failed"):
            train(cfg, progress=False, subprocess=False)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
