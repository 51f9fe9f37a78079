"""evaluation/stats.py by hand (issue 48, item 9): Student-t quantiles between tabulated degrees of freedom
(interpolated in 1/df), the unpaired branch of differences and ratios, and the bootstrap's seeding.

Floats are compared with ``pytest.approx`` at an absolute tolerance of 1e-9 unless stated otherwise.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from servegym.evaluation.stats import (
    bootstrap_interval,
    iqm,
    mean_ci,
    paired_difference,
    paired_ratio,
    probability_of_improvement,
    t_critical,
)

TOL = 1e-9

# ---------------------------------------------------------------------------------------------- t quantiles


@pytest.mark.parametrize(("df", "expected"), [
    # t(22) between t(20) = 2.086 and t(25) = 2.060, in 1/df: frac = (1/22 - 1/20) / (1/25 - 1/20) = 5/11,
    # 2.086 - 5/11 x 0.026 = 2.0741818... (linear in df would give frac 2/5 and 2.0756).
    (22, 2.086 - 5 / 11 * 0.026),
    # t(50) between t(40) = 2.021 and t(60) = 2.000: frac = (1/50 - 1/40) / (1/60 - 1/40) = 0.6, 2.021 - 0.6 x
    # 0.021 = 2.0084 (linear: 0.5, 2.0105).
    (50, 2.0084),
    # t(90) between t(60) = 2.000 and t(120) = 1.980: frac = (1/90 - 1/60) / (1/120 - 1/60) = 2/3, 1.98666...
    (90, 2.0 - 2 / 3 * 0.02),
])
def test_t_quantiles_between_tabulated_degrees_of_freedom_interpolate_in_reciprocal_df(df, expected):
    assert t_critical(df) == pytest.approx(expected, abs=TOL)


def test_t_quantiles_at_the_table_and_beyond_it():
    assert (t_critical(1), t_critical(2), t_critical(20), t_critical(120)) == (12.706, 4.303, 2.086, 1.980)
    assert t_critical(121) == 1.960 and t_critical(10_000) == 1.960  # the normal quantile past the table
    assert math.isnan(t_critical(0)) and math.isnan(t_critical(-3))
    # Monotone down through every interpolated stretch: a swapped end would make some stretch rise.
    values = [t_critical(df) for df in range(1, 130)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_mean_ci_uses_the_sample_deviation_and_t_of_n_minus_1():
    # [2, 4, 9]: mean 5, sample sd sqrt((9 + 1 + 16) / 2) = sqrt(13); half = t(2) sqrt(13) / sqrt(3).
    mean, half = mean_ci(np.array([2.0, 4.0, 9.0, np.nan]))  # the NaN is dropped
    assert mean == pytest.approx(5.0, abs=TOL) and half == pytest.approx(4.303 * math.sqrt(13 / 3), abs=TOL)
    one = mean_ci(np.array([7.0]))
    assert one[0] == 7.0 and math.isnan(one[1])


# ---------------------------------------------------------------------------------------------- unpaired


A = {0: 1.0, 1: 3.0, 2: 5.0}
"""Mean 3, sample sd 2: half-width t(2) x 2 / sqrt(3)."""
B = {1: 10.0, 2: 14.0, 3: 12.0, 4: 16.0}
"""Other seeds. Mean 13, sample sd sqrt(20 / 3): half-width t(3) x sqrt(20 / 3) / 2."""
HALF_A, HALF_B = 4.303 * 2 / math.sqrt(3), 3.182 * math.sqrt(20 / 3) / 2


def test_an_unpaired_difference_adds_the_two_half_widths_in_quadrature():
    # Seeds differ (0, 1, 2 against 1, 2, 3, 4): difference of the means 3 - 13 = -10, half sqrt(ha^2 + hb^2).
    diff = paired_difference(A, B)
    assert not diff.paired
    assert diff.mean == pytest.approx(-10.0, abs=TOL)
    assert diff.half == pytest.approx(math.hypot(HALF_A, HALF_B), abs=TOL)  # 6.4469..., not ha + hb = 9.08
    assert paired_difference(B, A).mean == pytest.approx(10.0, abs=TOL)


def test_an_unpaired_ratio_adds_relative_half_widths_and_keeps_its_half_positive():
    # Ratio of the means 3 / 13; half = |3/13| x sqrt((ha/3)^2 + (hb/13)^2).
    ratio = paired_ratio(A, B)
    assert not ratio.paired
    assert ratio.mean == pytest.approx(3 / 13 - 1, abs=TOL)
    assert ratio.half == pytest.approx(3 / 13 * math.hypot(HALF_A / 3, HALF_B / 13), abs=TOL)
    # A negative side (a return): ratio -3/13, the half-width still |ratio| x the relative widths, positive.
    negative = paired_ratio({s: -v for s, v in A.items()}, B)
    assert negative.mean == pytest.approx(-3 / 13 - 1, abs=TOL)
    assert negative.half == pytest.approx(3 / 13 * math.hypot(HALF_A / 3, HALF_B / 13), abs=TOL)


def test_paired_sides_use_per_seed_differences_and_ratios():
    # Same seeds: per-seed ratios 2/1 = 2 and 9/3 = 3 give 1 and 2 (mean 1.5), not the ratio of the means 5.5 / 2.
    ratio = paired_ratio({0: 2.0, 1: 9.0}, {0: 1.0, 1: 3.0})
    assert ratio.paired and ratio.mean == pytest.approx(1.5, abs=TOL)
    assert ratio.half == pytest.approx(12.706 * math.sqrt(0.5) / math.sqrt(2), abs=TOL)  # sd of (1, 2) = sqrt(.5)
    diff = paired_difference({0: 2.0, 1: 9.0}, {0: 1.0, 1: 3.0})  # differences 1 and 6
    assert diff.paired and diff.mean == pytest.approx(3.5, abs=TOL)
    assert diff.half == pytest.approx(12.706 * math.sqrt(12.5) / math.sqrt(2), abs=TOL)


# ---------------------------------------------------------------------------------------------- bootstrap


RUNS = np.array([[1.0, 4.0, 2.0, 8.0, 3.0], [2.5, 0.5, 6.0, 1.0, 7.0], [4.0, 4.5, 0.0, 9.0, 2.0]])
"""Three runs x five seeds, all distinct: a resampled IQM takes many values, so two seeds' intervals differ."""


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    first = bootstrap_interval(iqm, RUNS, seed=7)
    assert bootstrap_interval(iqm, RUNS, seed=7) == first
    assert bootstrap_interval(iqm, RUNS, seed=8) != first
    assert bootstrap_interval(iqm, RUNS) == bootstrap_interval(iqm, RUNS, seed=0)  # the default seed is 0
    assert bootstrap_interval(iqm, RUNS) != first


def test_the_interval_is_the_central_95_percent():
    # One run, seeds valued 1, 0, 0; statistic: the minimum of the resampled seeds. It is 1 only when all three
    # draws pick the first seed: probability 1/27 = 3.7%, above 2.5% and below 5%. So the 97.5th percentile of
    # 2000 resamples is 1 and the 2.5th is 0 (a 90% interval would be [0, 0]); seeded, the same every run.
    low, high = bootstrap_interval(lambda picked: float(picked.min()), np.array([[1.0, 0.0, 0.0]]))
    assert (low, high) == (0.0, 1.0)


def test_runs_and_seeds_are_both_resampled_and_the_base_moves_with_the_seeds():
    # Two runs of one seed, 0 and 1: only resampling the runs moves the mean (0, 0.5 or 1; each end has
    # probability 1/4), so the interval is [0, 1].
    assert bootstrap_interval(lambda picked: float(picked.mean()), np.array([[0.0], [1.0]])) == (0.0, 1.0)
    # One run of two seeds against a per-seed base: the run beats the base by 1 on each seed, so any resample
    # that keeps runs and base on the same seeds has P(improvement) = 1. A base left in place would pair seed 0's
    # run (1) with seed 1's base (9) on some draws.
    runs, base = np.array([[1.0, 10.0]]), np.array([0.0, 9.0])
    assert bootstrap_interval(probability_of_improvement, runs, base) == (1.0, 1.0)
