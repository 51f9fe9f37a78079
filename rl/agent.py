"""A trained agent as a :class:`~servegym.policies.Policy`: ``make_policy("rl:runs/<run>")``."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from servegym.envs.observation import QUEUE_FEATURES
from servegym.policies.base import Observation, Policy
from servegym.policies.common import visible_queue
from servegym.rl.train import algorithm_class
from servegym.rl.wrappers import count_action, window_action


class RLPolicy(Policy):
    """Drives the unwrapped env with a trained SB3 model: it normalises observations with the run's saved
    statistics, predicts deterministically, and maps the action through the run's action mode."""

    source = "stable-baselines3 agent trained by servegym train"
    rule = "learned admission controller"

    def __init__(self, run: str | Path, which: str = "best") -> None:
        self.run = Path(run)
        config_path = self.run / "config.json"
        if not config_path.is_file():
            raise ValueError(f"{self.run} is not a servegym train run (no config.json)")
        self.config = json.loads(config_path.read_text())
        model_path = self.run / ("best_model.zip" if which == "best" else "model.zip")
        if not model_path.is_file():
            model_path = self.run / "model.zip"
        self.model = algorithm_class(self.config["algo"]).load(model_path, device="cpu")
        self.mode = self.config["mode"]
        self.name = f"rl:{self.run.name}"
        self._stats = None
        norm = self.run / "vecnormalize.pkl"
        if norm.is_file():
            with norm.open("rb") as handle:
                venv = pickle.load(handle)
            self._stats = (venv.obs_rms, venv.clip_obs, venv.epsilon)

    def engine_overrides(self) -> dict[str, Any]:
        return dict(self.config.get("engine", {}))

    def _normalise(self, obs: Observation) -> Observation:
        if self._stats is None:
            return obs
        rms, clip, eps = self._stats
        return {k: np.clip((v - rms[k].mean) / np.sqrt(rms[k].var + eps), -clip, clip).astype(np.float32)
                for k, v in obs.items()}

    def masks(self, obs: Observation) -> np.ndarray:
        """The action mask the agent was trained with (admit mode: empty slots may only be 0)."""
        width = obs["queue"].shape[0] // len(QUEUE_FEATURES)
        visible = visible_queue(obs).shape[0]
        if self.mode == "admit":
            mask = np.zeros((width, 2), dtype=bool)
            mask[:, 0] = True
            mask[:visible, 1] = True
            return mask.ravel()
        n = self.model.action_space.n
        return np.arange(n) <= max(visible, 0)

    def act(self, obs: Observation) -> np.ndarray:
        kwargs = {"action_masks": self.masks(obs)} if self.config["algo"] == "maskable-ppo" else {}
        action, _ = self.model.predict(self._normalise(obs), deterministic=True, **kwargs)
        if self.mode == "count":
            return count_action(obs, int(np.asarray(action).reshape(-1)[0]))
        if self.mode == "window":
            return window_action(obs, float(np.asarray(action).reshape(-1)[0]), 16.0, 16384.0)
        return np.asarray(action, dtype=np.int64)
