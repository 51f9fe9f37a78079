"""Means with Student-t confidence intervals, paired differences, and rliable-style aggregates over training runs
(interquartile mean, probability of improvement, bootstrap intervals); no SciPy needed."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

MIN_VERDICT_SEEDS = 3
"""Fewest seeds a verdict may rest on (``servegym reproduce``'s claims, ``servegym bench``'s decision-sensitivity):
fewer give no confidence interval worth the name."""

# Two-sided 95% Student-t critical values t_{0.975, df}.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_critical(df: int) -> float:
    """``t_{0.975, df}``, interpolated between tabulated degrees of freedom; 1.96 beyond 120."""
    if df < 1:
        return math.nan
    if df in _T975:
        return _T975[df]
    if df > 120:
        return 1.960
    keys = sorted(_T975)
    upper = next(k for k in keys if k > df)
    lower = max(k for k in keys if k < df)
    frac = (1 / df - 1 / lower) / (1 / upper - 1 / lower)  # interpolate in 1/df
    return _T975[lower] + frac * (_T975[upper] - _T975[lower])


def mean_ci(values: np.ndarray) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (NaNs dropped; half-width NaN for n < 2)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return math.nan, math.nan
    if values.size == 1:
        return float(values[0]), math.nan
    return float(values.mean()), float(t_critical(values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))


@dataclass(frozen=True)
class Interval:
    """A mean and the half-width of its 95% CI; ``paired``: computed from per-seed differences over the same seeds
    (otherwise from the two sides' own intervals, which are wider)."""

    mean: float
    half: float
    paired: bool

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half

    def describe(self, fmt: str) -> str:
        """``+12.2% ± 3.8%, CI [8.4%, 16.0%]`` for ``fmt = "+.1%"`` (the half-width drops the sign)."""
        return (f"{self.mean:{fmt}} ± {self.half:{fmt.lstrip('+')}}, "
                f"CI [{self.low:{fmt.lstrip('+')}}, {self.high:{fmt.lstrip('+')}}]")


def paired_difference(a: dict[int, float], b: dict[int, float]) -> Interval:
    """``a - b`` over seeds: per-seed differences when both sides ran the same seeds; otherwise the difference of
    the means with half-width ``sqrt(ha**2 + hb**2)``."""
    if a.keys() == b.keys():
        seeds = sorted(a)
        return Interval(*mean_ci(np.array([a[s] - b[s] for s in seeds])), paired=True)
    (ma, ha), (mb, hb) = mean_ci(np.array(list(a.values()))), mean_ci(np.array(list(b.values())))
    return Interval(ma - mb, math.hypot(ha, hb), paired=False)


def paired_ratio(a: dict[int, float], b: dict[int, float]) -> Interval:
    """``a / b - 1`` over seeds: per-seed ratios when both sides ran the same seeds; otherwise the ratio of the
    means with the two relative half-widths added in quadrature."""
    if a.keys() == b.keys():
        seeds = sorted(a)
        return Interval(*mean_ci(np.array([a[s] / b[s] - 1.0 for s in seeds])), paired=True)
    (ma, ha), (mb, hb) = mean_ci(np.array(list(a.values()))), mean_ci(np.array(list(b.values())))
    ratio = ma / mb
    return Interval(ratio - 1.0, abs(ratio) * math.hypot(ha / ma, hb / mb), paired=False)


BOOTSTRAP_SAMPLES = 2000
"""Resamples of the bootstrap intervals of :func:`bootstrap_interval` (seeded: the same data, the same interval)."""


def iqm(values: np.ndarray) -> float:
    """The interquartile mean (rliable's aggregate): the mean of the values left after dropping the lowest and
    the highest ``floor(n / 4)``."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    cut = x.size // 4
    return float(x[cut: x.size - cut].mean())


def probability_of_improvement(runs: np.ndarray, base: np.ndarray, higher_is_better: bool = True) -> float:
    """The chance that one episode of a run beats ``base`` on the same seed: ``runs`` is runs x seeds, ``base``
    one value per seed; a tie counts a half."""
    runs, base = np.asarray(runs, dtype=np.float64), np.asarray(base, dtype=np.float64)
    diff = (runs - base) if higher_is_better else (base - runs)
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def bootstrap_interval(statistic: Callable[..., float], runs: np.ndarray, base: np.ndarray | None = None,
                       seed: int = 0) -> tuple[float, float]:
    """A 95% percentile bootstrap interval of ``statistic(runs[, base])``, resampling runs and seeds alike
    (``runs`` is runs x seeds; ``base`` one value per seed, resampled with the seeds)."""
    runs = np.asarray(runs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(BOOTSTRAP_SAMPLES):
        r = rng.integers(runs.shape[0], size=runs.shape[0])
        s = rng.integers(runs.shape[1], size=runs.shape[1])
        picked = runs[np.ix_(r, s)]
        samples.append(statistic(picked) if base is None else statistic(picked, np.asarray(base)[s]))
    low, high = np.percentile(samples, [2.5, 97.5])
    return float(low), float(high)
