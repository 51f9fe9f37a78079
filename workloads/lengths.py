"""Token-length distributions: discrete mixtures, uniform ranges, empirical samples."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from servegym.workloads.base import MAX_TOKENS


class LengthDist(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...

    def mean(self) -> float: ...


def check_token_count(name: str, value: object) -> None:
    """A token count is a whole number >= 1 given as an integer (``50.7`` is not silently cut to 50)."""
    if (isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral)
            or not 1 <= value <= MAX_TOKENS):
        raise ValueError(f"{name} must be whole token counts in [1, {MAX_TOKENS:,}] (integers), got {value!r}")


def _check_probs(probs: tuple[float, ...], n: int) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    if p.shape != (n,) or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
        raise ValueError(f"probs must be {n} non-negative numbers summing to 1, got {probs}")
    return p


@dataclass(frozen=True)
class Choice:
    """Lengths drawn from ``values`` with ``probs`` (the TWP paper's {50, 200, 800} style mixes)."""

    values: tuple[int, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("values must hold at least one token count")
        for value in self.values:
            check_token_count("values", value)
        _check_probs(self.probs, len(self.values))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, p=np.asarray(self.probs))

    def mean(self) -> float:
        return float(np.dot(self.values, self.probs))


@dataclass(frozen=True)
class RangeMix:
    """With probability ``probs[k]`` a length uniform on the integers of ``ranges[k]`` (inclusive)."""

    ranges: tuple[tuple[int, int], ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        for bounds in self.ranges:
            if len(bounds) != 2:
                raise ValueError(f"each range must be [lo, hi], got {list(bounds)}")
            lo, hi = bounds
            check_token_count("ranges", lo)
            check_token_count("ranges", hi)
            if not lo <= hi:
                raise ValueError(f"each range must satisfy 1 <= lo <= hi, got {(lo, hi)}")
        _check_probs(self.probs, len(self.ranges))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        bounds = np.asarray(self.ranges, dtype=np.int64)
        k = rng.choice(len(self.ranges), size=n, p=np.asarray(self.probs))
        return rng.integers(bounds[k, 0], bounds[k, 1] + 1)

    def mean(self) -> float:
        return float(sum(p * (lo + hi) / 2 for (lo, hi), p in zip(self.ranges, self.probs, strict=True)))


@dataclass(frozen=True)
class Empirical:
    """Lengths resampled (with replacement) from observed values."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.values or min(self.values) < 1:
            raise ValueError("empirical lengths must be a non-empty set of positive ints")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), size=n)]

    def mean(self) -> float:
        return float(np.mean(self.values))


@dataclass(frozen=True)
class PairedEmpirical:
    """(prompt, output) pairs resampled jointly, keeping their correlation."""

    prompts: tuple[int, ...]
    outputs: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.outputs) or not self.prompts:
            raise ValueError("prompts and outputs must be non-empty and of equal length")
        if min(self.prompts) < 1 or min(self.outputs) < 1:
            raise ValueError("paired lengths must be positive")

    def sample_pairs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, len(self.prompts), size=n)
        return np.asarray(self.prompts, dtype=np.int64)[idx], np.asarray(self.outputs, dtype=np.int64)[idx]
