"""The board's statistics beyond one comparison: Holm's correction over all of its paired comparisons, and the
across-task aggregates of normalized scores with rliable (Agarwal et al., "Deep Reinforcement Learning at the Edge
of the Statistical Precipice", NeurIPS 2021).

*Holm.* Every *better*/*worse* mark on the board is one test of a paired difference over seeds (a two-sided paired
t-test). With about a hundred of them, unadjusted 95% marks would call several differences by chance, so the marks
use Holm's step-down adjustment over the whole board (Holm 1979): it controls the family-wise error rate at 5%
without assuming the tests are independent.

*Across tasks.* Each policy's per-seed normalized scores (0 = the task's random floor, 100 = its oracle, clipped
to :data:`SCORE_CLIP`) form a seeds x tasks matrix; rliable's interquartile mean, optimality gap and performance
profile summarise it, with 95% stratified-bootstrap intervals (seeds resampled within each task, from a seeded
generator).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

ALPHA = 0.05
"""The family-wise error rate of the board's marks."""
SCORE_CLIP = (-100.0, 200.0)
"""Normalized scores are clipped to this range in the aggregates and shown as ``<-100``/``>200`` beyond it: on a
flat task the anchors lie close together, so a small difference in return is a large one in score."""
PROFILE_TAUS = (0.0, 50.0, 90.0, 100.0)
"""Scores at which the performance profile is read: the fraction of (seed, task) episodes above each."""
BOOTSTRAP_REPS = 2000
"""Stratified-bootstrap resamples of the aggregates (seeded: the same scores, the same intervals)."""


def paired_p_value(differences: Sequence[float]) -> float:
    """Two-sided p-value of a paired t-test that the mean of ``differences`` is 0 (NaN for fewer than two; 0 or 1
    when every difference is the same nonzero or zero value)."""
    from scipy import stats

    x = np.asarray(differences, dtype=np.float64)
    x = x[~np.isnan(x)]
    if x.size < 2:
        return math.nan
    sd = x.std(ddof=1)
    if sd == 0:
        return 0.0 if x.mean() != 0 else 1.0
    t = x.mean() / (sd / math.sqrt(x.size))
    return float(2.0 * stats.t.sf(abs(t), df=x.size - 1))


def holm(p_values: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Holm-adjusted p-values: sorted ascending, the i-th of m is ``max over j <= i of (m - j + 1) p_(j)``, capped at
    1. NaN p-values are not tests: they stay NaN and do not count in m."""
    tests = sorted((p, key) for key, p in p_values.items() if not math.isnan(p))
    adjusted: dict[Hashable, float] = {key: math.nan for key, p in p_values.items() if math.isnan(p)}
    running, m = 0.0, len(tests)
    for i, (p, key) in enumerate(tests):
        running = max(running, min(1.0, (m - i) * p))
        adjusted[key] = running
    return adjusted


def clip_score(value: float) -> float:
    return float(np.clip(value, *SCORE_CLIP)) if not math.isnan(value) else math.nan


def across_tasks(scores: Mapping[str, np.ndarray], seed: int = 0) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per policy, from its seeds x tasks matrix of normalized scores (0-100 units, clipped): rliable's IQM and
    optimality gap (mean shortfall below 100) and the performance profile at :data:`PROFILE_TAUS` (the fraction of
    episodes above each score), each as ``(value, low, high)`` with a 95% percentile interval from a stratified
    bootstrap: each task's seeds resampled with replacement, independently, :data:`BOOTSTRAP_REPS` times, from a
    generator seeded with ``seed`` afresh for each policy (the same resamples for every policy, so a policy's
    interval does not move when another joins; rliable's own bootstrap draws from an unseeded generator)."""
    from rliable import metrics

    result = {}
    for name, matrix in scores.items():
        rng = np.random.default_rng(seed)
        x = np.clip(np.asarray(matrix, dtype=np.float64), *SCORE_CLIP) / 100.0
        runs, tasks = x.shape

        def statistics(sample: np.ndarray) -> np.ndarray:
            return np.array([metrics.aggregate_iqm(sample), metrics.aggregate_optimality_gap(sample, 1.0),
                             *((sample > tau / 100.0).mean() for tau in PROFILE_TAUS)])

        picks = rng.integers(runs, size=(BOOTSTRAP_REPS, runs, tasks))  # stratified: rows drawn per task column
        samples = np.array([statistics(np.take_along_axis(x, pick, axis=0)) for pick in picks])
        point, (low, high) = statistics(x), np.percentile(samples, [2.5, 97.5], axis=0)
        scale = [100.0, 100.0, *([1.0] * len(PROFILE_TAUS))]
        keys = ["iqm", "optimality_gap", *(f"above_{tau:g}" for tau in PROFILE_TAUS)]
        result[name] = {k: (float(point[i] * scale[i]), float(low[i] * scale[i]), float(high[i] * scale[i]))
                        for i, k in enumerate(keys)}
    return result
