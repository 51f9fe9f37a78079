"""A trained agent as a :class:`~servegym.policies.Policy`: ``make_policy("rl:runs/<run>")``."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from servegym.envs.actions import count_action_masks, slot_action_masks
from servegym.envs.observation import QUEUE_FEATURES, scale_observation
from servegym.policies.base import Observation, Policy
from servegym.policies.common import visible_queue
from servegym.rl.evaluation import BEST_MODEL, BEST_STATS, FINAL_MODEL, FINAL_STATS
from servegym.rl.train import algorithm_class, latest_checkpoint
from servegym.rl.wrappers import (
    RESIDUAL_SCALE,
    ROUTE_MODE,
    count_action,
    params_action,
    rank_action,
    rank_grid,
    route_masks,
    route_observation,
    score_action,
    score_base,
    window_action,
)


class RLPolicy(Policy):
    """Drives the unwrapped env with a trained SB3 model: it normalises observations with the run's saved
    statistics, predicts deterministically, and maps the action through the run's action mode. A run of the
    ``route`` mode is a router (:attr:`decision` ``"route"``): on its routing task's env it returns the replica
    of each arrival, ``np.int64``."""

    source = "stable-baselines3 agent trained by servegym train"
    rule = "learned admission controller"

    def __init__(self, run: str | Path, which: str = "best") -> None:
        if which not in ("best", "final"):
            raise ValueError(f"which must be 'best' or 'final', got {which!r}")
        self.run = Path(run)
        config_path = self.run / "config.json"
        if not config_path.is_file():
            raise ValueError(f"{self.run} is not a servegym train run (no config.json)")
        self.config = json.loads(config_path.read_text())
        model_path, stats_path = _model_files(self.run, which)
        self.model = algorithm_class(self.config["algo"]).load(model_path, device="cpu")
        self.model_path = model_path
        self.mode = self.config["mode"]
        if self.mode == ROUTE_MODE:
            # An instance attribute over the ClassVar: what this run decides (servegym bench pairs it with
            # routing tasks; entry_decision reads the same from config.json).
            self.decision = "route"
            self.rule = "learned router"
        if self.mode == "rank" and self.config.get("rank_grid", rank_grid()) != rank_grid():
            raise ValueError(f"{self.run} was trained with rank actions {self.config['rank_grid']}, but this servegym "
                             f"maps them to {rank_grid()}; retrain it")
        self.name = f"rl:{self.run.name}"
        self._score_base = score_base(self.config.get("score_base_params"))  # a residual agent's scorer, or None
        # Inference on one thread: batches of one observation, and evaluation runs one process per core (two
        # threads per process on 2 busy cores: 18 against 4.4 ms a step in the score mode).
        torch.set_num_threads(1)
        self._vec_normalize = _load_vec_normalize(stats_path, self.model)
        if self.config.get("normalize", True) and self._vec_normalize is None:
            raise ValueError(f"{model_path} was trained with normalised observations but {stats_path.name} is "
                             "missing")

    def __deepcopy__(self, memo: dict[int, Any]) -> RLPolicy:
        """A copy sharing the model and the frozen statistics: the agent keeps no state between steps (it
        predicts deterministically from the observation alone), so copies act alike and cannot interfere, and
        the oracle can copy it at every decision point (a ``VecNormalize`` cannot be deep-copied)."""
        clone = copy.copy(self)
        memo[id(self)] = clone
        return clone

    def engine_overrides(self) -> dict[str, Any]:
        """Only the length mode the agent was trained with: its observations mean that. Everything else (KV
        size, limits) is the task's or the caller's, so an agent is never scored on an easier engine."""
        mode = self.config.get("engine", {}).get("length_mode")
        return {"length_mode": mode} if mode else {}

    def _normalise(self, obs: Observation) -> Observation:
        """The keys the agent was trained on (a run from before ``obs["progress"]`` has none), scaled or
        normalised as in its training."""
        if self.mode == ROUTE_MODE:  # the flat vector it trained on, from the env's Dict (or a flat_obs env)
            obs = route_observation(obs)
            return obs if self._vec_normalize is None else self._vec_normalize.normalize_obs(obs)
        space = self.model.observation_space
        if isinstance(space, gym.spaces.Dict) and len(space.spaces) != len(obs):
            obs = {key: obs[key] for key in space.spaces}
        if self.config.get("observation") == "scaled":
            obs = scale_observation(obs)
        return obs if self._vec_normalize is None else self._vec_normalize.normalize_obs(obs)

    def masks(self, obs: Observation) -> np.ndarray:
        """The action mask the agent was trained with (admit mode: empty slots may only be 0; route mode: the
        replicas that can hold the arriving request)."""
        if self.mode == ROUTE_MODE:
            return route_masks(obs, self.model.action_space.n)
        visible = visible_queue(obs).shape[0]
        if self.mode == "admit":
            return slot_action_masks(obs["queue"].shape[0] // len(QUEUE_FEATURES), visible, 2)
        return count_action_masks(self.model.action_space.n, visible)

    def act(self, obs: Observation) -> np.ndarray | np.int64:
        kwargs = {"action_masks": self.masks(obs)} if self.config["algo"] == "maskable-ppo" else {}
        action, _ = self.model.predict(self._normalise(obs), deterministic=True, **kwargs)
        if self.mode == ROUTE_MODE:
            return np.int64(np.asarray(action).reshape(-1)[0])
        if self.mode == "count":
            return count_action(obs, int(np.asarray(action).reshape(-1)[0]))
        if self.mode == "window":
            return window_action(obs, float(np.asarray(action).reshape(-1)[0]))
        if self.mode == "rank":
            order, target = (int(v) for v in np.asarray(action).reshape(-1)[:2])
            return rank_action(obs, order, target)
        if self.mode == "params":
            return params_action(obs, action, self._score_base)
        if self.mode == "score":
            return score_action(obs, np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0),
                                self._score_base, self.config.get("residual_scale", RESIDUAL_SCALE))
        return np.asarray(action, dtype=np.int64)


def _model_files(run: Path, which: str) -> tuple[Path, Path]:
    """The model and the statistics saved with it: the best (or, asked or without one, the final) model, else
    the latest checkpoint of a run that was stopped early."""
    candidates = [(BEST_MODEL, BEST_STATS), (FINAL_MODEL, FINAL_STATS)]
    for model, stats in candidates if which == "best" else candidates[::-1]:
        if (run / model).is_file():
            if model == BEST_MODEL and not (run / stats).is_file() and (run / FINAL_STATS).is_file():
                warnings.warn(f"{run} predates {BEST_STATS}: its best model is paired with the final statistics "
                              "(retrain for a faithful pairing)", UserWarning, stacklevel=3)
                return run / model, run / FINAL_STATS
            return run / model, run / stats
    checkpoint = latest_checkpoint(run)
    if checkpoint is None:
        raise ValueError(f"{run} holds no model yet (no {BEST_MODEL}, {FINAL_MODEL} or checkpoint)")
    steps = checkpoint.name.removeprefix("model_").removesuffix("_steps.zip")
    return checkpoint, checkpoint.with_name(f"model_vecnormalize_{steps}_steps.pkl")


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
