"""Stable-baselines3's ``VecEnv`` over :class:`~servegym.envs.vector.ServingVectorEnv` (training envs stepped in
the training process, one call for all of them) or :class:`~servegym.envs.sharded.ShardedVectorEnv` (the same,
split over processes), with the semantics of SB3's ``DummyVecEnv``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.vec_env import VecEnv

from servegym.envs.vector import EnvCall, ServingVectorEnv


class NativeVecEnv(VecEnv):
    """SB3's ``VecEnv`` interface over one :class:`ServingVectorEnv` in same-step autoreset: ``step_wait``
    returns the next episode's first observation for an env that just ended, with the final one in
    ``infos[i]["terminal_observation"]`` and ``infos[i]["TimeLimit.truncated"]`` (truncated and not
    terminated), as ``DummyVecEnv`` does, so the same factories give the same transitions. ``reset`` applies the
    seeds and options set by ``seed`` and ``set_options`` (then forgets them, as SB3 does). ``shards`` > 1 steps
    the envs in that many processes (this one and ``shards - 1`` workers), the same transitions."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], shards: int = 1) -> None:
        if shards == 1:
            self.vector = ServingVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP, copy=False)
            self.envs = self.vector.envs  # as DummyVecEnv has them (sharded, they live in other processes)
        else:
            from servegym.envs.sharded import ShardedVectorEnv

            self.vector = ShardedVectorEnv(env_fns, shards, autoreset_mode=AutoresetMode.SAME_STEP, copy=False)
        super().__init__(self.vector.num_envs, self.vector.single_observation_space,
                         self.vector.single_action_space)
        self._actions: np.ndarray | None = None

    def reset(self) -> Any:
        for i in range(self.num_envs):
            self.reset_infos[i] = self.vector.reset_env(i, self._seeds[i], self._options[i] or None)
        self._reset_seeds()
        self._reset_options()
        return _copied(self.vector.observations)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        obs, rewards, terminations, truncations, raw = self.vector.step_raw(self._actions)
        dones = terminations | truncations
        infos = []
        for i, info in enumerate(raw):
            if dones[i]:
                self.reset_infos[i] = {k: v for k, v in info.items() if k not in ("final_obs", "final_info")}
                info = {**info["final_info"], "terminal_observation": info["final_obs"]}
            info["TimeLimit.truncated"] = bool(truncations[i] and not terminations[i])
            infos.append(info)
        return _copied(obs), rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.vector.close()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [self.vector.apply(i, EnvCall(attr_name)) for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        for i in self._get_indices(indices):  # on the outermost wrapper, as DummyVecEnv sets it
            self.vector.apply(i, _SetOuter(attr_name, value))

    def env_method(self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any) -> list[Any]:
        return [self.vector.apply(i, EnvCall(method_name, method_args, method_kwargs))
                for i in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: Any = None) -> list[bool]:
        return [self.vector.apply(i, _IsWrapped(wrapper_class)) for i in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return list(self.vector.render())

    def _get_indices(self, indices: Any) -> Iterable[int]:
        if indices is None:
            return range(self.num_envs)
        return [indices] if isinstance(indices, int) else indices


def _copied(obs: Any) -> Any:
    """A copy of the batch buffer (the next step overwrites it; SB3 keeps the last observation across steps)."""
    if isinstance(obs, dict):
        return {k: v.copy() for k, v in obs.items()}
    return obs.copy()


@dataclass(frozen=True)
class _SetOuter:
    name: str
    value: Any

    def __call__(self, env: gym.Env) -> None:
        setattr(env, self.name, self.value)


@dataclass(frozen=True)
class _IsWrapped:
    wrapper_class: type[gym.Wrapper]

    def __call__(self, env: gym.Env) -> bool:
        from stable_baselines3.common import env_util

        return env_util.is_wrapped(env, self.wrapper_class)
