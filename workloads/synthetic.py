"""Synthetic workloads: an arrival process plus prompt and output length distributions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.validation import count, expected_requests, positive_number
from servegym.workloads.arrivals import ArrivalProcess
from servegym.workloads.base import RequestSpec
from servegym.workloads.lengths import LengthDist, PairedEmpirical


@dataclass(frozen=True)
class SyntheticWorkload:
    """Requests arriving over ``duration_s`` seconds (at most ``max_requests``), lengths drawn independently.

    ``lengths`` may instead be a :class:`PairedEmpirical` that draws (prompt, output) pairs jointly; then
    ``prompt`` and ``output`` must be None.
    """

    arrivals: ArrivalProcess
    duration_s: float
    prompt: LengthDist | None = None
    output: LengthDist | None = None
    paired: PairedEmpirical | None = None
    max_requests: int | None = None

    def __post_init__(self) -> None:
        positive_number("duration_s", self.duration_s)
        if (self.paired is None) == (self.prompt is None or self.output is None):
            raise ValueError("give either both prompt and output distributions, or paired")
        if self.max_requests is not None:
            count("max_requests", self.max_requests, "requests")
        expected_requests("arrivals", self.arrivals.mean_rate(), self.duration_s)  # before any time is drawn

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        arrival = self.arrivals.sample(rng, self.duration_s)
        if self.max_requests is not None:
            arrival = arrival[: self.max_requests]
        n = arrival.size
        if self.paired is not None:
            prompt, output = self.paired.sample_pairs(rng, n)
        else:
            prompt, output = self.prompt.sample(rng, n), self.output.sample(rng, n)
        return RequestSpec(arrival, prompt, output)

    def mean_rate(self) -> float:
        return self.arrivals.mean_rate()


@dataclass(frozen=True)
class FixedWorkload:
    """A given list of requests, replayed as is (tests, benchmarks, hand-made cases)."""

    spec: RequestSpec

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        return self.spec
