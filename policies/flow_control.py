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

from servegym.engine.config import LengthMode
from servegym.envs.observation import QUEUE_INDEX, length_mode_of
from servegym.policies.base import Observation, Policy, admit_first, ranks_action, register_policy
from servegym.policies.common import (
    admission_blocks,
    fcfs_count,
    free_blocks,
    free_slots,
    prefix_that_fits,
    visible_queue,
)
from servegym.policies.params import PolicyParams, param, positive_int, positive_number

if TYPE_CHECKING:
    import optuna

_ROUNDING = 1e-9
"""Tolerance for summing a float budget: repeated additions of ``b`` fall just short of whole numbers."""


def _check_classes(name: str, value: object) -> None:
    if value is None:
        return
    pairs = list(value) if isinstance(value, list | tuple) else None
    if not pairs or any(not isinstance(p, list | tuple) or len(p) != 2 for p in pairs):
        raise ValueError(f"{name} must be a list of (output length, budget) pairs, got {value!r}")
    for length, budget in pairs:
        positive_int(f"{name} output length", length)
        positive_number(f"{name} budget", budget)
    if len({int(length) for length, _ in pairs}) != len(pairs):
        raise ValueError(f"{name} names an output length twice: {value!r}")


class TokenBucket:
    """Credits accrue at ``rate`` per step; :meth:`take` hands out the whole ones. Only the fraction carries
    over: whole credits not used this step lapse, so an idle spell cannot bank a burst, and over ``n`` steps
    the grants sum to ``floor(n rate)`` or ``ceil(n rate)``."""

    def __init__(self, rate: float) -> None:
        self.rate, self.credit = rate, 0.0

    def take(self) -> int:
        self.credit += self.rate
        whole = math.floor(self.credit + _ROUNDING)  # b = 0.1 summed ten times is 0.999...: still one credit
        self.credit = max(self.credit - whole, 0.0)
        return whole


@dataclass(frozen=True)
class FlowControlParams(PolicyParams):
    activation_budget: float = param(
        1.0, "b: most activations per step; a fraction is a rate (one every 1/b steps)", positive_number
    )
    respect_free_kv: bool = param(True, "also stop when the head's prompt does not fit in free KV (no thrashing)")
    class_budgets: tuple[tuple[int, float], ...] | None = param(
        None, "known lengths: (output length, b_k) pairs, one token bucket per class (servegym.stability."
        "class_budgets derives them); other classes, and unknown lengths, use activation_budget", _check_classes)

    def validate(self) -> None:
        if self.class_budgets is not None:  # YAML gives lists; keep the frozen params hashable
            object.__setattr__(self, "class_budgets", tuple((int(k), float(b)) for k, b in self.class_budgets))


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
        self.bucket = TokenBucket(self.params.activation_budget)
        self.class_buckets = {k: TokenBucket(b) for k, b in self.params.class_budgets or ()}

    def act(self, obs: Observation) -> np.ndarray:
        if self.class_buckets and length_mode_of(obs) is LengthMode.KNOWN:
            return self._act_per_class(obs)
        whole = self.bucket.take()
        fits = fcfs_count(obs) if self.params.respect_free_kv else min(visible_queue(obs).shape[0], free_slots(obs))
        return admit_first(obs, min(whole, fits))

    def _act_per_class(self, obs: Observation) -> np.ndarray:
        """Each class admits FIFO within its own budget; classes without one share ``activation_budget``."""
        grants = {k: bucket.take() for k, bucket in self.class_buckets.items()}
        shared = self.bucket.take()
        rows = visible_queue(obs)
        chosen = []
        for slot, length in enumerate(rows[:, QUEUE_INDEX["output_hi"]].astype(np.int64).tolist()):
            if grants.get(length, 0) > 0:
                grants[length] -= 1
                chosen.append(slot)
            elif length not in grants and shared > 0:
                shared -= 1
                chosen.append(slot)
        fits = prefix_that_fits(admission_blocks(obs, rows[chosen]), free_blocks(obs)) \
            if self.params.respect_free_kv else len(chosen)
        return ranks_action(obs, chosen[: min(fits, free_slots(obs))])
