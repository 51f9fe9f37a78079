"""ServerlessLLM-style serving (Fu et al., OSDI 2024): locality-aware startup with fast checkpoint loading.

Arrivals go to a container that already holds the model (warm or loading); a cold start happens only when
none does, and it is shorter: ServerlessLLM's loader reports 10-200x faster model loading, and this policy
takes the conservative end, 10x (``cold_start_scale = 0.1``). Live migration of token state between
containers is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servegym.policies.base import register_policy
from servegym.policies.fcfs import FCFS


@dataclass(frozen=True)
class ServerlessLLMParams:
    load_speedup: float = field(default=10.0, metadata={"help": "checkpoint-loading speed-up (paper: 10-200x)"})

    def __post_init__(self) -> None:
        if not 1.0 <= self.load_speedup <= 1000.0:
            raise ValueError(f"load_speedup must be in [1, 1000], got {self.load_speedup!r}")


@register_policy
class ServerlessLLM(FCFS):
    """FCFS admission; warm-first routing; cold starts shortened by fast checkpoint loading."""

    name = "serverless-llm"
    source = "Fu et al.: ServerlessLLM: Low-Latency Serverless Inference for Large Language Models (OSDI 2024)"
    rule = "FCFS admission, routing to a container holding the model, 10x faster cold starts"

    def __init__(self, **params: Any) -> None:
        self.params = ServerlessLLMParams(**params)

    def pool_overrides(self) -> dict[str, Any]:
        return {"router": "warm_first", "cold_start_scale": 1.0 / self.params.load_speedup}
