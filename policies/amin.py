"""A_min (Chen, Ye, Zhou 2025): robust scheduling under interval predictions, from the lower ends up.

Each request's length estimate starts at the lower end ``lo`` of its prediction interval and doubles each
time the request outgrows it (capped at ``hi``). The estimate is a function of what the observation shows
(``lo``, ``hi``, tokens generated), so a preempted request returns to the queue with its raised estimate.
Admission is greedy, shortest estimate first, while the future-memory check on the estimates holds; on KV
overflow the engine evicts in ascending order of predicted output length, the paper's order (the
``shortest_predicted`` preemption rule, on the same estimate).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servegym.engine.preemption import amin_estimate
from servegym.envs.observation import QUEUE_INDEX, RUNNING_INDEX
from servegym.policies.base import Observation, Policy, ranks_action, register_policy
from servegym.policies.common import longest_feasible_prefix, running_rows, visible_queue


@register_policy
class AMin(Policy):
    """Shortest lower-end estimate first under a future-memory check; estimates double when outgrown."""

    name = "amin"
    stateless = True
    source = "Chen, Ye, Zhou: Adaptively Robust LLM Inference Optimization under Prediction Uncertainty (2025)"
    rule = "estimate = lower end, doubled when outgrown; shortest estimate first; evict shortest estimate first"
    uses_output_lengths = True

    def engine_overrides(self) -> dict[str, Any]:
        return {"preemption": "shortest_predicted"}

    def reset(self) -> None:
        self.running_estimates = np.zeros(0)

    def act(self, obs: Observation) -> np.ndarray:
        run = running_rows(obs)
        generated = run[:, RUNNING_INDEX["num_generated"]]
        self.running_estimates = amin_estimate(run[:, RUNNING_INDEX["output_lo"]], run[:, RUNNING_INDEX["output_hi"]],
                                               generated)
        rows = visible_queue(obs)
        queued_gen = rows[:, QUEUE_INDEX["num_generated"]]
        estimate = amin_estimate(rows[:, QUEUE_INDEX["output_lo"]], rows[:, QUEUE_INDEX["output_hi"]], queued_gen)
        order = np.argsort(estimate - queued_gen, kind="stable")
        count = longest_feasible_prefix(obs, np.maximum(self.running_estimates - generated, 1.0), rows[order],
                                        np.maximum(estimate[order] - queued_gen[order], 1.0))
        return ranks_action(obs, order[:count])
