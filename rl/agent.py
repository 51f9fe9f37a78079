"""A trained agent as a :class:`~servegym.policies.Policy`: ``make_policy("rl:runs/<run>")``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from servegym.envs.actions import count_action_masks, slot_action_masks
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
        self._vec_normalize = _load_vec_normalize(self.run / "vecnormalize.pkl", self.model)

    def engine_overrides(self) -> dict[str, Any]:
        return dict(self.config.get("engine", {}))

    def _normalise(self, obs: Observation) -> Observation:
        return obs if self._vec_normalize is None else self._vec_normalize.normalize_obs(obs)

    def masks(self, obs: Observation) -> np.ndarray:
        """The action mask the agent was trained with (admit mode: empty slots may only be 0)."""
        visible = visible_queue(obs).shape[0]
        if self.mode == "admit":
            return slot_action_masks(obs["queue"].shape[0] // len(QUEUE_FEATURES), visible, 2)
        return count_action_masks(self.model.action_space.n, visible)

    def act(self, obs: Observation) -> np.ndarray:
        kwargs = {"action_masks": self.masks(obs)} if self.config["algo"] == "maskable-ppo" else {}
        action, _ = self.model.predict(self._normalise(obs), deterministic=True, **kwargs)
        if self.mode == "count":
            return count_action(obs, int(np.asarray(action).reshape(-1)[0]))
        if self.mode == "window":
            return window_action(obs, float(np.asarray(action).reshape(-1)[0]))
        return np.asarray(action, dtype=np.int64)


class _SpacesOnly(gym.Env):
    """An env that only carries spaces: what ``VecNormalize.load`` needs to check a saved run against."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space, self.action_space = observation_space, action_space


def _load_vec_normalize(path: Path, model: Any) -> VecNormalize | None:
    """The run's saved observation statistics, frozen (no updates at evaluation), or None without them."""
    if not path.is_file():
        return None
    spaces_only = DummyVecEnv([lambda: _SpacesOnly(model.observation_space, model.action_space)])
    vec_normalize = VecNormalize.load(str(path), spaces_only)
    vec_normalize.training = False
    return vec_normalize
