"""Sarathi-Serve-style stall-free batching (Agrawal et al., OSDI 2024)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from servegym.policies.base import Observation, Policy, admit_first, register_policy
from servegym.policies.common import engine_values
from servegym.policies.params import PolicyParams, param, positive_int
from servegym.policies.vllm import admit_within_budget, budget_after_running


@dataclass(frozen=True)
class SarathiParams(PolicyParams):
    token_budget: int = param(512, "fixed tokens per iteration (decodes + prefill chunks)", positive_int)

@register_policy
class SarathiServe(Policy):
    """Every step: all decodes, then ongoing prefill chunks, then new admissions, under one fixed token budget."""

    name = "sarathi"
    stateless = True
    source = "Agrawal et al.: Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve (OSDI 2024)"
    rule = "stall-free batching: decodes, then ongoing prefill chunks, then admissions, under a fixed chunk budget"
    Params = SarathiParams


    def engine_overrides(self) -> dict[str, Any]:
        budget = self.params.token_budget
        return {"max_num_batched_tokens": budget, "prefill_chunk_tokens": budget, "max_num_seqs": min(128, budget)}

    def act(self, obs: Observation) -> np.ndarray:
        engine = engine_values(obs)  # read once for both rules
        return admit_first(obs, admit_within_budget(obs, budget_after_running(obs, self.params.token_budget, engine),
                                                     engine))
