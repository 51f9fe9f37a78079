"""Random admission: the floor a scheduler must beat. Each visible waiting request is admitted with
probability ``p`` each step, in queue order (the engine stops at the first that does not fit)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.envs.observation import QUEUE_FEATURES
from servegym.policies.base import Observation, Policy, register_policy
from servegym.policies.common import visible_queue
from servegym.policies.params import PolicyParams, in_range, non_negative_int, param


@dataclass(frozen=True)
class RandomAdmitParams(PolicyParams):
    admit_probability: float = param(0.5, "chance that each visible waiting request is admitted this step",
                                     in_range(0.0, 1.0))
    seed: int = param(0, "seed of the policy's own generator (restarted by reset)", non_negative_int)


@register_policy
class RandomAdmit(Policy):
    """A seeded coin per visible waiting request per step."""

    name = "random"
    source = "reference: random admission (the headroom floor of docs/SCENARIOS.md)"
    rule = "admit each visible waiting request with probability p, in queue order"
    Params = RandomAdmitParams

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)

    def act(self, obs: Observation) -> np.ndarray:
        width = obs["queue"].shape[0] // len(QUEUE_FEATURES)
        action = np.zeros(width, dtype=np.int64)
        visible = visible_queue(obs).shape[0]
        action[:visible] = self.rng.random(visible) < self.params.admit_probability
        return action
