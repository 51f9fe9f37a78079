"""Periodic evaluation of a training run on a fixed seed list, and the run directory's small files.

Every evaluation replays the same validation seeds through its own env (never the training envs), so scores
are comparable across evaluations; the best model is saved together with the normalisation statistics it was
scored with.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

BEST_MODEL, BEST_STATS = "best_model.zip", "best_vecnormalize.pkl"
FINAL_MODEL, FINAL_STATS = "model.zip", "vecnormalize.pkl"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write strict JSON (no NaN or infinities) atomically: a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False))
    os.replace(tmp, path)


def evaluate(model: Any, env: gym.Env, seeds: Sequence[int], normalize: Callable[[Any], Any] | None = None,
             masked: bool = False) -> list[float]:
    """Deterministic episode returns (undiscounted, unnormalised rewards) of ``model`` on each seed."""
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        total, done = 0.0, False
        while not done:
            kwargs = {"action_masks": env.get_wrapper_attr("action_masks")()} if masked else {}
            action, _ = model.predict(normalize(obs) if normalize else obs, deterministic=True, **kwargs)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


class SeedListEval(BaseCallback):
    """Every ``eval_freq`` calls, score the model on ``seeds``; keep the best model and its statistics.

    ``on_best(score, timesteps)`` runs after each new best is saved (the trainer records it in config.json);
    the saves and ``on_best`` run inside one ``saving()`` block (the trainer's: a signal waits for its end).
    With ``at_start`` the model is also scored before its first step, as a reference in ``eval.csv`` (the warm
    start's validation return) but not a candidate: the kept model is always a trained one.
    """

    def __init__(self, env: gym.Env, seeds: Sequence[int], eval_freq: int, run: Path, masked: bool,
                 on_best: Callable[[float, int], None], best_score: float = -math.inf,
                 saving: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 at_start: bool = False) -> None:
        super().__init__()
        self.at_start = at_start
        self.env, self.seeds, self.eval_freq, self.run = env, tuple(seeds), eval_freq, run
        self.masked, self.on_best, self.best_score, self.saving = masked, on_best, best_score, saving
        self.history: list[tuple[int, float]] = []

    def _on_training_start(self) -> None:
        if self.at_start and self.num_timesteps == 0:
            self.evaluate_now(candidate=False)

    def _on_step(self) -> bool:
        if self.n_calls % self.eval_freq == 0:
            self.evaluate_now()
        return True

    def evaluate_now(self, candidate: bool = True) -> float:
        stats = self.model.get_vec_normalize_env()
        returns = evaluate(self.model, self.env, self.seeds, stats.normalize_obs if stats else None, self.masked)
        score = float(np.mean(returns))
        self.history.append((self.num_timesteps, score))
        self.logger.record("eval/mean_return", score)
        self.logger.record("eval/std_return", float(np.std(returns)))
        with (self.run / "eval.csv").open("a") as handle:
            handle.write(f"{self.num_timesteps},{score!r}\n")
        if candidate and score > self.best_score:
            self.best_score = score
            with self.saving():
                self.model.save(self.run / BEST_MODEL)
                if stats is not None:
                    stats.save(str(self.run / BEST_STATS))
                self.on_best(score, self.num_timesteps)
        return score
