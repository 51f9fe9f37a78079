"""Random floors per action mode: a uniformly random action of one learning action mode, every step.

A learned agent acts through an action mode (:mod:`servegym.rl.wrappers`); the floor it must beat is not only
random admission (``random``, the admit mode's uniform action) but a uniformly random action of its own mode: in
``rank`` mode, say, every action is one of 24 sensible rules, so a random pick among them is already a strong
policy. ``make_policy("random:count")``, ``"random:window"`` and ``"random:rank"`` build them; the benchmark runs
them as floors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.envs.observation import queue_matrix
from servegym.policies.base import Observation, Policy
from servegym.policies.params import PolicyParams, non_negative_int, param
from servegym.rl.wrappers import (
    MAX_ADMIT,
    RANK_MEMORY_TARGETS,
    RANK_ORDERS,
    count_action,
    rank_action,
    score_action,
    window_action,
)

FLOOR_MODES = ("count", "window", "rank", "score")
"""The action modes with a random floor of their own (the admit mode's is ``random``)."""


def _check_mode(name: str, value: object) -> None:
    if value not in FLOOR_MODES:
        raise ValueError(f"{name} must be one of {FLOOR_MODES}, got {value!r}")


@dataclass(frozen=True)
class RandomActionParams(PolicyParams):
    mode: str = param("rank", "the action mode whose uniform random action is taken each step", _check_mode)
    seed: int = param(0, "seed of the policy's own generator (restarted by reset)", non_negative_int)


class RandomAction(Policy):
    """A uniformly random action of ``mode`` each step: ``count`` admits 0..MAX_ADMIT from the head, ``window``
    draws the token-window value uniformly in [-1, 1], ``rank`` one of the rank mode's orders and memory targets,
    ``score`` uniform slot scores and memory target (a random order of the queue, a random target)."""

    name = "random-action"
    source = "benchmark floor: a uniformly random action of one learning action mode"
    rule = "each step, a uniformly random action of the mode's action space, mapped as the agent's would be"
    Params = RandomActionParams

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)

    def act(self, obs: Observation) -> np.ndarray:
        mode = self.params.mode
        if mode == "count":
            return count_action(obs, int(self.rng.integers(MAX_ADMIT + 1)))
        if mode == "window":
            return window_action(obs, float(self.rng.uniform(-1.0, 1.0)))
        if mode == "score":
            return score_action(obs, self.rng.uniform(-1.0, 1.0, queue_matrix(obs).shape[0] + 1))
        return rank_action(obs, int(self.rng.integers(len(RANK_ORDERS))),
                           int(self.rng.integers(len(RANK_MEMORY_TARGETS))))
