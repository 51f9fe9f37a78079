"""Named workloads. Rates are set against the shipped ``paper-v100-llama3.2-3b`` profile (see README).

With the TWP paper's length mix (mean prompt 245, mean output 65 tokens) and the default engine
(``max_num_seqs=128``), FCFS on that profile keeps its backlog near zero up to about 5.5 requests/s and
serves at most about 5.6 requests/s when overloaded (measured by ``benchmarks/capacity.py``). The scenarios
sit below, near, above and in bursts over that capacity.
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

CAPACITY_RPS = 5.5
"""FCFS capacity of the shipped profile on the TWP length mix (see the module docstring)."""
SCENARIO_RATES = {"low": 2.5, "medium": 5.0, "high": 7.5}
"""Poisson rates (requests/s): about 0.45x, 0.9x and 1.35x :data:`CAPACITY_RPS`."""
BURST = MarkovModulated(base_rate=2.0, burst_rate=14.0, calm_s=10.0, burst_s=3.0)
"""Calm at 2 req/s, bursts of 14 req/s (2.5x capacity) lasting 3 s on average; mean 4.8 req/s (0.87x)."""
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
    "low": (lambda: _twp(SCENARIO_RATES["low"]), "TWP length mix, Poisson 2.5 req/s for 60 s (0.45x capacity)"),
    "medium": (lambda: _twp(SCENARIO_RATES["medium"]), "TWP length mix, Poisson 5 req/s for 60 s (0.9x capacity)"),
    "high": (lambda: _twp(SCENARIO_RATES["high"]), "TWP length mix, Poisson 7.5 req/s for 60 s (1.35x capacity)"),
    "burst": (lambda: _twp(BURST), "TWP length mix, MMPP-2: 2 req/s calm (10 s), 14 req/s bursts (3 s), for 60 s"),
    "twp-gsm8k": (
        lambda: _twp(SCENARIO_RATES["medium"], GSM8K_SHAPED_PROMPTS),
        "GSM8K-shaped prompts (60% 30-80, 30% 120-250, 10% 350-512), TWP outputs, Poisson 5 req/s",
    ),
    "gsm8k": (
        lambda: SyntheticWorkload(Poisson(SCENARIO_RATES["medium"]), DURATION_S, paired=gsm8k_pairs()),
        "GSM8K question/answer word counts as token lengths, Poisson 5 req/s for 60 s",
    ),
    "gamma-bursty": (
        lambda: _twp(Gamma(SCENARIO_RATES["medium"], cv=3.0)),
        "TWP length mix, gamma renewal arrivals at 5 req/s with inter-arrival CV 3 (bursty)",
    ),
    "cpu-fidelity": (
        lambda: SyntheticWorkload(Poisson(6.0), 20.0, prompt=Choice((32, 128, 256), (0.5, 0.3, 0.2)),
                                  output=Choice((16, 64, 128), (0.5, 0.3, 0.2))),
        "short prompts/outputs, Poisson 6 req/s for 20 s: crosses B0 of the CPU profile in a few minutes of CPU",
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
