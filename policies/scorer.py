"""A parametric scorer: the search comparator of the learning agents (issue 27).

Four numbers decide every admission: a request's score is minus its prompt, minus ``output_weight`` times its
predicted output, plus ``wait_weight`` times the seconds it has waited; the queue is admitted highest score
first while the projected peak KV use (upper-bound lengths) stays within ``target_base + target_slope x
tanh(waiting / 32)`` of the cache (:func:`~servegym.policies.common.admit_by_score`, the ``score`` action mode's
rule). It spans shortest-prompt, shortest-total and MC-SF-like orders, ageing against starvation, and a memory
target that loosens or tightens with the queue. Tuned by an evolution strategy (``servegym tune --policy scorer
--sampler cmaes``), it is the margin a learned agent in ``score`` mode should reach: the agent sees the same
features and acts through the same rule, and can make the scores depend on the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.envs.observation import QUEUE_INDEX, length_mode_of
from servegym.policies.base import Observation, Policy, engine_feature, output_estimate, register_policy
from servegym.policies.common import admit_by_score, cached_tokens, visible_queue
from servegym.policies.params import PolicyParams, in_range, non_negative_number, param, positive_number

if TYPE_CHECKING:
    import optuna

QUEUE_SCALE = 32.0
"""Waiting requests at which the memory target has moved tanh(1) = 76% of ``target_slope``."""


@dataclass(frozen=True)
class ScorerParams(PolicyParams):
    output_weight: float = param(1.0, "tokens of score lost per predicted output token (prompt counts 1)",
                                 non_negative_number)
    wait_weight: float = param(0.0, "tokens of score gained per second waited (ageing)", non_negative_number)
    target_base: float = param(1.0, "memory target with an empty queue: fraction of the cache the projected peak "
                                    "may reach", positive_number)
    target_slope: float = param(0.0, "memory target change as the queue grows (x tanh(waiting / 32))",
                                in_range(-1.0, 1.0))


@register_policy
class Scorer(Policy):
    """Score = -(prompt + a x predicted output) + b x wait; admit best first within a queue-dependent memory
    target."""

    name = "scorer"
    stateless = True
    source = "search comparator: a 4-parameter scorer tuned by an evolution strategy (issue 27)"
    rule = "score -(prompt + a*output) + b*wait, best first, peak KV within c + d*tanh(waiting/32) of the cache"
    uses_output_lengths = True
    Params = ScorerParams

    @staticmethod
    def search_space(trial: optuna.Trial) -> dict[str, Any]:
        return {"output_weight": trial.suggest_float("output_weight", 0.0, 4.0),
                "wait_weight": trial.suggest_float("wait_weight", 0.0, 400.0),
                "target_base": trial.suggest_float("target_base", 0.4, 1.5),
                "target_slope": trial.suggest_float("target_slope", -0.6, 0.6)}

    def memory_target(self, obs: Observation) -> float:
        return memory_target(obs, self.params.target_base, self.params.target_slope)

    def scores(self, obs: Observation) -> np.ndarray:
        """One score per visible waiting request, queue order."""
        return scores(obs, self.params.output_weight, self.params.wait_weight)

    def act(self, obs: Observation) -> np.ndarray:
        return admit_by_score(obs, self.scores(obs), self.memory_target(obs))


def scores(obs: Observation, output_weight: float, wait_weight: float) -> np.ndarray:
    """The scorer's score of each visible waiting request, queue order: ``wait_weight x wait - prompt -
    output_weight x predicted output``, the prompt counting only its uncached tokens (prefix caching)."""
    rows = visible_queue(obs)
    output = output_estimate(rows[:, QUEUE_INDEX["output_lo"]], rows[:, QUEUE_INDEX["output_hi"]],
                             length_mode_of(obs), None)
    prompt = rows[:, QUEUE_INDEX["num_prompt_tokens"]]
    if "queue_prefix" in obs:
        prompt = prompt - cached_tokens(obs, rows.shape[0])
    return wait_weight * rows[:, QUEUE_INDEX["wait_s"]] - prompt - output_weight * output


def memory_target(obs: Observation, target_base: float, target_slope: float) -> float:
    """The scorer's memory target: ``target_base + target_slope x tanh(waiting / 32)``, at least 0.05."""
    return max(0.05, target_base + target_slope * math.tanh(engine_feature(obs, "num_waiting") / QUEUE_SCALE))
