"""Flow control (Dong & Cao: "Flow-Controlled Scheduling for LLM Inference with Provable Stability Guarantees").

At most ``b`` new requests join the active set per step, taken first-in first-out; a fractional ``b`` is a
rate, enforced by a token bucket. On KV overflow the engine evicts last-in first-out (the most recently
activated first) and evicted requests return to the queue head to recompute. The rule needs no output
lengths, so it runs unchanged in the paper's known-length and unknown-length settings; the lengths enter
only through the stability analysis (:mod:`servegym.stability`) that picks ``b``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.policies.base import Observation, Policy, admit_first, register_policy
from servegym.policies.common import fcfs_count, free_slots, visible_queue
from servegym.policies.params import PolicyParams, param, positive_number

if TYPE_CHECKING:
    import optuna

_ROUNDING = 1e-9
"""Tolerance for summing a float budget: repeated additions of ``b`` fall just short of whole numbers."""


@dataclass(frozen=True)
class FlowControlParams(PolicyParams):
    activation_budget: float = param(
        1.0, "b: most activations per step; a fraction is a rate (one every 1/b steps)", positive_number
    )
    respect_free_kv: bool = param(True, "also stop when the head's prompt does not fit in free KV (no thrashing)")

@register_policy
class FlowControl(Policy):
    """Admit at most ``b`` requests per step in FIFO order; evict LIFO on KV overflow."""

    name = "flow-control"
    source = "Dong & Cao: Flow-Controlled Scheduling for LLM Inference with Provable Stability Guarantees"
    rule = "at most b activations per step (token bucket for fractional b), FIFO admission, LIFO eviction"
    Params = FlowControlParams


    @staticmethod
    def search_space(trial: optuna.Trial) -> dict[str, Any]:
        return {"activation_budget": trial.suggest_float("activation_budget", 0.05, 32.0, log=True)}

    def engine_overrides(self) -> dict[str, Any]:
        return {"preemption": "lifo"}

    def reset(self) -> None:
        self.credit = 0.0

    def act(self, obs: Observation) -> np.ndarray:
        # Credits accrue at b per step; whole credits become activations. Only the fraction carries over:
        # whole credits that the queue or the KV cache could not use lapse, so an idle spell cannot bank a
        # burst. Over n saturated steps this admits floor(n b) or ceil(n b), and never more than ceil(n b).
        self.credit += self.params.activation_budget
        whole = math.floor(self.credit + _ROUNDING)  # b = 0.1 summed ten times is 0.999...: still one credit
        fits = fcfs_count(obs) if self.params.respect_free_kv else min(visible_queue(obs).shape[0], free_slots(obs))
        self.credit = max(self.credit - whole, 0.0)
        return admit_first(obs, min(whole, fits))
