"""MC-SF (Jaillet et al. 2025): memory-constrained shortest-first admission."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.envs.observation import QUEUE_INDEX, length_mode_of
from servegym.policies.base import Observation, Policy, output_estimate, ranks_action, register_policy
from servegym.policies.common import (
    cached_tokens,
    longest_feasible_prefix,
    upper_remaining_queue,
    upper_remaining_running,
    visible_queue,
)
from servegym.policies.params import PolicyParams, param, positive_number

if TYPE_CHECKING:
    import optuna

ORDERS = ("output", "prompt", "total")


def _check_order(name: str, value: Any) -> None:
    if value not in ORDERS:
        raise ValueError(f"{name} must be one of {ORDERS}, got {value!r}")


@dataclass(frozen=True)
class MCShortestFirstParams(PolicyParams):
    order: str = param("output", "sort key, shortest first: predicted output (the paper), prompt (its uncached "
                       "part with prefix caching), or their total",
                       _check_order)
    memory_target: float = param(1.0, "the projected peak KV use may reach this fraction of the cache (the paper: 1)",
                                 positive_number)


@register_policy
class MCShortestFirst(Policy):
    """Sort the queue by predicted output length; admit the longest prefix that keeps future memory within M."""

    name = "mc-sf"
    stateless = True
    source = ("Jaillet, Jiang, Mellou, Molinaro, Podimata, Zhou: "
              "Online Scheduling for LLM Inference with KV Cache Constraints (2025)")
    rule = "queue sorted by predicted output ascending; admit the longest prefix feasible at every future completion"
    uses_output_lengths = True
    Params = MCShortestFirstParams

    @staticmethod
    def search_space(trial: optuna.Trial) -> dict[str, Any]:
        return {"order": trial.suggest_categorical("order", ORDERS),
                "memory_target": trial.suggest_float("memory_target", 0.3, 1.5)}

    def act(self, obs: Observation) -> np.ndarray:
        rows = visible_queue(obs)
        mode = length_mode_of(obs)
        predicted = output_estimate(rows[:, QUEUE_INDEX["output_lo"]], rows[:, QUEUE_INDEX["output_hi"]], mode, None)
        prompt = rows[:, QUEUE_INDEX["num_prompt_tokens"]]
        if "queue_prefix" in obs:  # a prompt's work is its uncached part
            prompt = prompt - cached_tokens(obs, rows.shape[0])
        key = {"output": predicted, "prompt": prompt, "total": prompt + predicted}[self.params.order]
        order = np.argsort(key, kind="stable")
        rows = rows[order]
        count = longest_feasible_prefix(obs, upper_remaining_running(obs), rows, upper_remaining_queue(rows),
                                        self.params.memory_target)
        return ranks_action(obs, order[:count])
