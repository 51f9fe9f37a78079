"""Named workloads. Rates are set against the shipped ``paper-v100-llama3.2-3b`` profile (see README).

With the TWP paper's length mix (mean output 65 tokens) and the default engine, FCFS on that profile keeps
up with about 4.4 requests/s at most (measured by ``benchmarks/capacity.py``). The scenarios sit below,
near, above and in bursts over that.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np
from servegym.workloads.arrivals import Gamma, MarkovModulated, Poisson
from servegym.workloads.base import Workload
from servegym.workloads.lengths import Choice, PairedEmpirical, RangeMix
from servegym.workloads.synthetic import SyntheticWorkload
from servegym.workloads.trace import TraceWorkload, bundled_trace

TWP_PROMPTS = Choice((50, 200, 800), (0.5, 0.3, 0.2))
"""The TWP paper's prompt mix."""
TWP_OUTPUTS = Choice((20, 50, 200), (0.5, 0.3, 0.2))
"""The TWP paper's output mix (mean 65 tokens)."""
GSM8K_SHAPED_PROMPTS = RangeMix(((30, 80), (120, 250), (350, 512)), (0.6, 0.3, 0.1))
"""The TWP paper's GSM8K-shaped prompt lengths."""

SCENARIO_RATES = {"low": 2.0, "medium": 4.0, "high": 6.0}
"""Poisson rates (requests/s): about 0.45x, 0.9x and 1.35x the FCFS capacity of the shipped profile."""
BURST = MarkovModulated(base_rate=2.0, burst_rate=12.0, calm_s=8.0, burst_s=3.0)
"""Calm at 2 req/s, bursts of 12 req/s (2.7x capacity) lasting 3 s on average; mean rate 4.7 req/s."""
DURATION_S = 60.0


def _twp(rate_or_process, prompts=TWP_PROMPTS) -> SyntheticWorkload:
    arrivals = Poisson(rate_or_process) if isinstance(rate_or_process, float) else rate_or_process
    return SyntheticWorkload(arrivals, DURATION_S, prompt=prompts, output=TWP_OUTPUTS)


@lru_cache(maxsize=1)
def gsm8k_pairs(tokens_per_word: float = 1.0) -> PairedEmpirical:
    """(question, answer) lengths from the bundled GSM8K counts, one word = ``tokens_per_word`` tokens."""
    path = bundled_trace("gsm8k_lengths.csv")
    data = np.genfromtxt(path, delimiter=",", skip_header=1, usecols=(1, 2), dtype=np.int64)
    prompts = np.maximum(1, np.round(data[:, 0] * tokens_per_word)).astype(int)
    outputs = np.maximum(1, np.round(data[:, 1] * tokens_per_word)).astype(int)
    return PairedEmpirical(tuple(prompts.tolist()), tuple(outputs.tolist()))


WORKLOADS: dict[str, tuple[Callable[[], Workload], str]] = {
    "low": (lambda: _twp(SCENARIO_RATES["low"]), "TWP length mix, Poisson 2 req/s for 60 s (below capacity)"),
    "medium": (lambda: _twp(SCENARIO_RATES["medium"]), "TWP length mix, Poisson 4 req/s for 60 s (near capacity)"),
    "high": (lambda: _twp(SCENARIO_RATES["high"]), "TWP length mix, Poisson 6 req/s for 60 s (above capacity)"),
    "burst": (lambda: _twp(BURST), "TWP length mix, MMPP-2: 2 req/s calm, 12 req/s bursts, for 60 s"),
    "twp-gsm8k": (
        lambda: _twp(SCENARIO_RATES["medium"], GSM8K_SHAPED_PROMPTS),
        "GSM8K-shaped prompts (60% 30-80, 30% 120-250, 10% 350-512), TWP outputs, Poisson 4 req/s",
    ),
    "gsm8k": (
        lambda: SyntheticWorkload(Poisson(SCENARIO_RATES["medium"]), DURATION_S, paired=gsm8k_pairs()),
        "GSM8K question/answer word counts as token lengths, Poisson 4 req/s for 60 s",
    ),
    "gamma-bursty": (
        lambda: _twp(Gamma(SCENARIO_RATES["medium"], cv=3.0)),
        "TWP length mix, gamma renewal arrivals at 4 req/s with inter-arrival CV 3 (bursty)",
    ),
    "azure-code": (
        lambda: TraceWorkload(str(bundled_trace()), duration_s=120.0),
        "Azure LLM code trace 2023 (CC-BY-4.0), first 120 s replayed in real time",
    ),
}


def make_workload(name: str) -> Workload:
    """Build a named workload (see :data:`WORKLOADS`)."""
    try:
        factory, _ = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {sorted(WORKLOADS)}") from None
    return factory()
