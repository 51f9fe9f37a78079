"""alpha-protection greedy (the flow-control paper's baseline): FCFS under a memory ceiling, clear on overflow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.policies.base import Observation, Policy, admit_first, register_policy
from servegym.policies.common import fcfs_count, free_blocks, total_blocks
from servegym.policies.params import PolicyParams, in_range, param

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class AlphaProtectionParams(PolicyParams):
    alpha: float = param(0.1, "protected fraction of KV memory kept free at admission", in_range(0.0, 1.0, True))

@register_policy
class AlphaProtection(Policy):
    """Admit FCFS while used KV stays at or below ``(1 - alpha) M``; on overflow evict every running request."""

    name = "alpha-protection"
    stateless = True
    source = "Dong & Cao (flow-control paper), baseline: alpha-protection greedy"
    rule = "FCFS while usage <= (1 - alpha) M; on overflow clear all running requests"
    Params = AlphaProtectionParams


    @staticmethod
    def search_space(trial: optuna.Trial) -> dict[str, Any]:
        return {"alpha": trial.suggest_float("alpha", 0.0, 0.6)}

    def engine_overrides(self) -> dict[str, Any]:
        return {"preemption": "clear_all"}

    def act(self, obs: Observation) -> np.ndarray:
        total = total_blocks(obs)
        used = total - free_blocks(obs)
        ceiling = (1.0 - self.params.alpha) * total - used
        return admit_first(obs, fcfs_count(obs, budget_blocks=max(0.0, ceiling)))
