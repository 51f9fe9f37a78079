"""ServerlessLLM-style serving (Fu et al., OSDI 2024): locality-aware startup with fast checkpoint loading.

Arrivals go to a container that already holds the model (warm or loading); a cold start happens only when
none does, and it is shorter: ServerlessLLM's loader reports 10-200x faster model loading, and this policy
takes the conservative end, 10x (``cold_start_scale = 0.1``). Live migration of token state between
containers is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servegym.policies.base import register_policy
from servegym.policies.fcfs import FCFS
from servegym.policies.params import PolicyParams, in_range, param


@dataclass(frozen=True)
class ServerlessLLMParams(PolicyParams):
    load_speedup: float = param(10.0, "checkpoint-loading speed-up (paper: 10-200x)", in_range(1.0, 1000.0))

@register_policy
class ServerlessLLM(FCFS):
    """FCFS admission; warm-first routing; cold starts shortened by fast checkpoint loading."""

    name = "serverless-llm"
    source = "Fu et al.: ServerlessLLM: Low-Latency Serverless Inference for Large Language Models (OSDI 2024)"
    rule = "FCFS admission, routing to a container holding the model, 10x faster cold starts"
    Params = ServerlessLLMParams


    def pool_overrides(self) -> dict[str, Any]:
        return {"router": "warm_first", "cold_start_scale": 1.0 / self.params.load_speedup}
