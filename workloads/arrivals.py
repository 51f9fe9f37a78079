"""Arrival processes over a finite horizon: Poisson, gamma renewal, two-state Markov-modulated Poisson."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from servegym.validation import positive_number


class ArrivalProcess(Protocol):
    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        """Sorted arrival times in ``[0, duration_s)``."""
        ...

    def mean_rate(self) -> float: ...


def _renewal(rng: np.random.Generator, duration_s: float, draw) -> np.ndarray:
    """Cumulate inter-arrival gaps from ``draw(n)`` until the horizon is passed."""
    chunks, t, n = [], 0.0, 64
    while t < duration_s:
        times = t + np.cumsum(draw(n))
        chunks.append(times)
        t = float(times[-1])
        n *= 2
    times = np.concatenate(chunks) if chunks else np.zeros(0)
    return times[times < duration_s]


@dataclass(frozen=True)
class Poisson:
    """Exponential inter-arrival gaps at ``rate`` requests per second."""

    rate: float

    def __post_init__(self) -> None:
        positive_number("rate", self.rate)

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        return _renewal(rng, duration_s, lambda n: rng.exponential(1.0 / self.rate, n))

    def mean_rate(self) -> float:
        return self.rate


@dataclass(frozen=True)
class Gamma:
    """Gamma renewal process. Burstiness: the inter-arrival coefficient of variation ``cv``.

    ``cv = 1`` is Poisson; ``cv > 1`` is burstier (the index of dispersion of counts tends to ``cv**2``).
    """

    rate: float
    cv: float

    def __post_init__(self) -> None:
        positive_number("rate", self.rate)
        positive_number("cv", self.cv)

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return _renewal(rng, duration_s, lambda n: rng.gamma(shape, 1.0 / (self.rate * shape), n))

    def mean_rate(self) -> float:
        return self.rate


@dataclass(frozen=True)
class MarkovModulated:
    """Two-state Markov-modulated Poisson process (MMPP-2): calm at ``base_rate``, bursts at ``burst_rate``.

    Each state lasts an exponential time (means ``calm_s`` and ``burst_s``). The episode starts calm.
    Burstiness: the peak-to-mean ratio ``burst_rate / mean_rate()``.
    """

    base_rate: float
    burst_rate: float
    calm_s: float
    burst_s: float

    def __post_init__(self) -> None:
        for name in ("base_rate", "burst_rate", "calm_s", "burst_s"):
            positive_number(name, getattr(self, name))

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        parts, t, burst = [], 0.0, False
        while t < duration_s:
            dwell = rng.exponential(self.burst_s if burst else self.calm_s)
            end = min(t + dwell, duration_s)
            rate = self.burst_rate if burst else self.base_rate
            count = rng.poisson(rate * (end - t))
            parts.append(np.sort(rng.uniform(t, end, count)))
            t, burst = end, not burst
        return np.concatenate(parts) if parts else np.zeros(0)

    def mean_rate(self) -> float:
        total = self.calm_s + self.burst_s
        return (self.base_rate * self.calm_s + self.burst_rate * self.burst_s) / total
