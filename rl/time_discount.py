"""Discounting in simulated seconds for PPO and A2C (issue 27): a semi-Markov decision process.

A step of the serving env lasts one engine iteration, or with ``decision_steps`` as many as pass until the next
decision: from milliseconds to seconds. A per-step ``gamma`` then weighs a second of the future differently
depending on how busy the engine is. Here each transition is discounted by the simulated time it took,
``gamma_t = 2 ** (-step_s / half_life_s)`` (``info["step_s"]``), in the return and in GAE:

    delta_t = r_t + gamma_t V(s_{t+1}) - V(s_t),    A_t = delta_t + gamma_t lambda A_{t+1}.

:class:`TimeDiscount` (a callback) writes each step's ``gamma_t`` into the rollout buffer
(:func:`buffer_class`) before SB3 stores the step, and makes the bootstrap of a time-limit truncation use it
too (SB3 adds ``gamma x V(terminal)``; the callback adds the difference to ``gamma_t``). The algorithm's own
``gamma`` then matters only to ``VecNormalize``'s reward scaling, which the time-discounted recipes leave off
(``normalize: false``, a fixed ``reward_scale``). Unlike the env's ``reward_half_life_s``, which scales rewards
by time since the episode began, the values here stay stationary: a state is worth the same at minute one and
minute ten.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback


def step_discount(step_s: np.ndarray | float, half_life_s: float) -> np.ndarray:
    """``2 ** (-step_s / half_life_s)``: the discount of a transition that lasted ``step_s`` simulated seconds."""
    return np.power(2.0, -np.asarray(step_s, dtype=np.float64) / half_life_s)


class _PerStepDiscount:
    """A rollout buffer whose discount is set per transition (``discounts``, one per step and env)."""

    buffer_size: int
    n_envs: int
    gae_lambda: float
    rewards: np.ndarray
    values: np.ndarray
    episode_starts: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self.discounts = np.ones((self.buffer_size, self.n_envs), dtype=np.float32)

    def compute_returns_and_advantage(self, last_values: torch.Tensor, dones: np.ndarray) -> None:
        """GAE(lambda) with ``discounts[t]`` in place of a fixed gamma."""
        next_values = last_values.clone().cpu().numpy().flatten()
        next_non_terminal = 1.0 - dones.astype(np.float32)
        gae = np.zeros(self.n_envs, dtype=np.float32)
        for step in reversed(range(self.buffer_size)):
            if step < self.buffer_size - 1:
                next_non_terminal = 1.0 - self.episode_starts[step + 1]
                next_values = self.values[step + 1]
            gamma = self.discounts[step]
            delta = self.rewards[step] + gamma * next_values * next_non_terminal - self.values[step]
            gae = delta + gamma * self.gae_lambda * next_non_terminal * gae
            self.advantages[step] = gae
        self.returns = self.advantages + self.values


class TimeDiscountBuffer(_PerStepDiscount, RolloutBuffer):
    """SB3's ``RolloutBuffer`` with per-transition discounts."""


class TimeDiscountDictBuffer(_PerStepDiscount, DictRolloutBuffer):
    """SB3's ``DictRolloutBuffer`` (Dict observations) with per-transition discounts."""


def buffer_class(observation_dict: bool) -> type[RolloutBuffer]:
    """The rollout buffer to pass as ``rollout_buffer_class`` to PPO or A2C."""
    return TimeDiscountDictBuffer if observation_dict else TimeDiscountBuffer


class TimeDiscount(BaseCallback):
    """Sets each transition's discount from ``info["step_s"]`` (see the module); needs a buffer from
    :func:`buffer_class`."""

    def __init__(self, half_life_s: float) -> None:
        super().__init__()
        if not (np.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError(f"half_life_s must be finite and > 0, got {half_life_s!r}")
        self.half_life_s = half_life_s

    def _on_training_start(self) -> None:
        if not isinstance(self.model.rollout_buffer, _PerStepDiscount):
            raise TypeError("TimeDiscount needs the rollout buffer of servegym.rl.time_discount.buffer_class; got "
                            f"{type(self.model.rollout_buffer).__name__}")

    def _on_step(self) -> bool:
        infos: list[dict[str, Any]] = self.locals["infos"]
        if any("step_s" not in info for info in infos):
            raise KeyError("TimeDiscount reads each step's simulated seconds from info['step_s'], which this env's "
                           "steps do not report (a servegym serving env does)")
        gammas = step_discount([info["step_s"] for info in infos], self.half_life_s)
        buffer = self.model.rollout_buffer
        buffer.discounts[buffer.pos] = gammas
        rewards, dones = self.locals["rewards"], self.locals["dones"]
        for i, info in enumerate(infos):  # SB3 bootstraps a time-limit truncation with its own gamma
            if dones[i] and info.get("TimeLimit.truncated", False) and info.get("terminal_observation") is not None:
                terminal = self.model.policy.obs_to_tensor(info["terminal_observation"])[0]
                with torch.no_grad():
                    value = float(self.model.policy.predict_values(terminal)[0])
                rewards[i] += (gammas[i] - self.model.gamma) * value
        return True
