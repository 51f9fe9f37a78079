"""The reproduction verdict rules at their edges (issue 48, item 9): exactly half the workloads failing, partial
wins of a "beats" claim, ties in a "lowest" claim, intervals that touch a range's edge, an undefined interval.

Per-seed values are chosen so every interval is exact by hand: equal per-seed differences or ratios give a
zero-width CI at their common value.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.evaluation import TaskResult
from servegym.evaluation.reproduction import (
    NOT,
    PARTLY,
    REPRODUCED,
    Table,
    beats_claim,
    every_pair_verdict,
    gain_verdict,
    lowest_claim,
    near_claim,
    range_verdict,
    within_verdict,
)
from servegym.evaluation.stats import Interval

METRIC = "e2e_mean_all_s"


def table(values: dict[tuple[str, str], list[float]], metric: str = METRIC) -> Table:
    """One TaskResult per (workload, policy, seed 0..n-1) holding ``metric``."""
    return Table([TaskResult(policy, workload, seed, {metric: value}, np.zeros(1), np.zeros(1))
                  for (workload, policy), per_seed in values.items() for seed, value in enumerate(per_seed)])


# ---------------------------------------------------------------------------------------------- edges of a range


def test_a_range_includes_its_edges():
    # The claimed edge placed exactly on an end of the CI (0.45 + 0.05 is not exact in binary, so the edge is the
    # computed end itself). CI [0.45, 0.55] with its low end on the edge: wholly inside, reproduced. CI [0.35,
    # 0.45] with its high end on the edge: it touches the range, so it is not wholly outside: partly.
    inside, touching = Interval(0.50, 0.05, True), Interval(0.40, 0.05, True)
    assert range_verdict(inside, low=inside.low) == REPRODUCED
    assert range_verdict(touching, low=touching.high) == PARTLY
    assert range_verdict(Interval(0.30, 0.05, True), low=0.45) == NOT  # CI [0.25, 0.35]: wholly below


def test_within_a_tolerance_a_ci_starting_on_it_is_partly_and_above_it_not():
    # CI [0.10, 0.14] against "within 10%": it starts on the edge (not wholly above), so partly.
    touching = Interval(0.12, 0.02, True)
    assert within_verdict(touching, touching.low) == PARTLY
    assert within_verdict(Interval(0.12, 0.01, True), 0.10) == NOT  # CI [0.11, 0.13]


def test_an_undefined_interval_is_partly_never_reproduced_or_not():
    # One seed: the half-width is NaN, so the CI's ends are NaN and no comparison holds.
    undefined = Interval(0.5, math.nan, True)
    assert range_verdict(undefined, low=0.45) == PARTLY
    assert range_verdict(undefined, high=0.10) == PARTLY
    assert gain_verdict(undefined, 0.45) == PARTLY


def test_a_gain_whose_ci_starts_at_zero_shows_no_direction():
    # CI [0, 0.10] against a +45% claim: wholly below the claim; its low end is 0, not above zero, so no real gain
    # is shown: not reproduced (a CI [0.01, 0.11] would be a smaller real gain: partly).
    assert gain_verdict(Interval(0.05, 0.05, True), 0.45) == NOT
    assert gain_verdict(Interval(0.06, 0.05, True), 0.45) == PARTLY


# ---------------------------------------------------------------------------------------------- per-workload rule


def near(ratios: list[float]) -> tuple[str, str]:
    """A near-hindsight claim over one workload per ratio: the policy at ``ratio`` x the reference on every seed,
    so each workload's CI is the single point ``ratio - 1``; the tolerance is 10%."""
    values = {}
    for i, ratio in enumerate(ratios):
        values[(f"w{i}", "policy")] = [100.0 * ratio] * 3
        values[(f"w{i}", "reference")] = [100.0] * 3
    claim = near_claim(table(values), "P", "near", "policy", "reference", METRIC, 0.10)
    return claim.verdict, claim.reason


def test_exactly_half_the_workloads_failing_is_partly():
    # 1.05 -> +5% (within 10%: reproduced); 1.25 -> +25% (outside: not). Two of four not reproduced is half, not
    # more than half: partly.
    verdict, reason = near([1.05, 1.25, 1.05, 1.25])
    assert verdict == PARTLY
    assert reason.endswith("(2 reproduced, 2 not reproduced of 4 workloads)")


def test_more_than_half_failing_is_not_and_one_failing_is_partly():
    assert near([1.25, 1.25, 1.05])[0] == NOT  # 2 of 3 > 1.5
    assert near([1.25, 1.05, 1.05])[0] == PARTLY  # 1 of 3
    assert near([1.05, 1.05, 1.05])[0] == REPRODUCED  # every workload
    assert near([1.25])[0] == NOT  # 1 of 1


def test_a_partly_workload_keeps_the_claim_from_reproduced():
    # One workload straddles 10% (ratios 1.05, 1.10, 1.15 per seed: mean +10%, CI wider than zero): partly there,
    # reproduced elsewhere: partly overall, never reproduced.
    values = {("a", "policy"): [105.0, 110.0, 115.0], ("a", "reference"): [100.0] * 3,
              ("b", "policy"): [105.0] * 3, ("b", "reference"): [100.0] * 3}
    claim = near_claim(table(values), "P", "near", "policy", "reference", METRIC, 0.10)
    assert claim.verdict == PARTLY and "(1 reproduced, 1 partly reproduced of 2 workloads)" in claim.reason


# ---------------------------------------------------------------------------------------------- "beats": partial wins


def test_a_significant_loss_makes_a_beats_claim_not_reproduced_even_with_wins():
    # Lower latency wins. Workload a: policy 10 on every seed; x at 12 (+2: a win), y at 10 (a tie), z at 9 (-1: a
    # significant loss). Workload b: policy 10, x 11 (+1: a win). 2 wins of 4 pairs and a loss: not reproduced (the
    # old one-pair rule said partly).
    values = {("a", "policy"): [10.0] * 3, ("a", "x"): [12.0] * 3, ("a", "y"): [10.0] * 3,
              ("a", "z"): [9.0] * 3, ("b", "policy"): [10.0] * 3, ("b", "x"): [11.0] * 3}
    claim = beats_claim(table(values), "P", "beats", "policy", ["x", "y", "z"], METRIC, (METRIC,))
    assert claim.verdict == NOT
    assert claim.measured.startswith("better in 2 and worse in 1 of 4 (baseline, workload) pairs")
    assert "a: x +2 ± 0, CI [2, 2] (better), y +0 ± 0, CI [0, 0], z -1 ± 0, CI [-1, -1] (worse)" in claim.measured
    assert "b: x +1 ± 0, CI [1, 1] (better)" in claim.measured


@pytest.mark.parametrize(("baselines", "verdict", "head"), [
    # x 12 and w 13 beaten, y 10 tied, z 9 lower: per pair +2, +3, 0, -1.
    (["x", "w", "y"], PARTLY, "better in 2 and worse in 0 of 3"),  # most won, none lost
    (["x", "y"], NOT, "better in 1 and worse in 0 of 2"),  # half is not most
    (["x", "w"], REPRODUCED, "better in 2 and worse in 0 of 2"),  # every pair
    (["x", "w", "z"], NOT, "better in 2 and worse in 1 of 3"),  # most won, but one significant loss
    (["y"], NOT, "better in 0 and worse in 0 of 1"),  # a tie alone
])
def test_the_every_pair_rule_on_constructed_results(baselines, verdict, head):
    values = {("a", "policy"): [10.0] * 3, ("a", "x"): [12.0] * 3, ("a", "w"): [13.0] * 3,
              ("a", "y"): [10.0] * 3, ("a", "z"): [9.0] * 3}
    claim = beats_claim(table(values), "P", "beats", "policy", baselines, METRIC, (METRIC,))
    assert claim.verdict == verdict and claim.measured.startswith(head)


@pytest.mark.parametrize(("wins", "losses", "total", "verdict"), [
    (3, 0, 3, REPRODUCED), (2, 0, 3, PARTLY), (3, 0, 5, PARTLY), (2, 0, 4, NOT), (3, 1, 4, NOT), (0, 0, 0, NOT),
    (1, 0, 1, REPRODUCED), (0, 1, 1, NOT),
])
def test_every_pair_verdict(wins, losses, total, verdict):
    assert every_pair_verdict(wins, losses, total) == verdict


def test_higher_is_better_flips_which_baselines_are_beaten():
    # Throughput: the policy's 10 beats y's 8 (+2) and loses to x's 12 (-2): one win of two.
    values = {("w", "policy"): [10.0] * 3, ("w", "x"): [12.0] * 3, ("w", "y"): [8.0] * 3}
    claim = beats_claim(table(values, "throughput_tps"), "P", "tp", "policy", ["x", "y"], "throughput_tps",
                        ("throughput_tps",), higher_is_better=True)
    assert claim.verdict == NOT and claim.measured.startswith("better in 1 and worse in 1 of 2")
    assert "x -2 ± 0, CI [-2, -2] (worse), y +2 ± 0, CI [2, 2] (better)" in claim.measured
    assert claim.reason.startswith("higher mean throughput_tps")
    none = beats_claim(table({("w", "policy"): [10.0] * 3, ("w", "x"): [12.0] * 3}, "throughput_tps"), "P", "tp",
                       "policy", ["x"], "throughput_tps", ("throughput_tps",), higher_is_better=True)
    assert none.verdict == NOT and none.measured.startswith("better in 0 and worse in 1 of 1")


# ---------------------------------------------------------------------------------------------- "lowest"


def test_a_tie_for_lowest_is_partly():
    # fcfs equals twp on every seed: the difference is exactly 0 (CI [0, 0]). It neither excludes zero in twp's
    # favour (reproduced needs low > 0) nor shows fcfs lower (not needs high < 0): partly.
    values = {("w", "twp"): [1.0, 2.0, 3.0], ("w", "fcfs"): [1.0, 2.0, 3.0], ("w", "priority"): [5.0, 6.0, 7.0]}
    claim = lowest_claim(table(values, "ttft_p99"), "P", "lowest", "twp", "ttft_p99", ".2f")
    assert claim.verdict == PARTLY
    assert "fcfs − twp +0.00 ± 0.00, CI [0.00, 0.00]: partly reproduced" in claim.measured


def test_lowest_names_the_least_favourable_rival_and_fails_when_one_is_clearly_lower():
    # twp 2 on every seed. Rivals: fcfs 5 (+3), priority 2.5 (+0.5), sarathi 9 (+7): all exclude zero in twp's
    # favour, reproduced; the closest (smallest lower end) is priority, the one shown. Then vllm at 1.5 (-0.5):
    # a rival clearly lower, so not reproduced, and vllm is the one shown.
    values = {("w", "twp"): [2.0] * 3, ("w", "fcfs"): [5.0] * 3, ("w", "priority"): [2.5] * 3,
              ("w", "sarathi"): [9.0] * 3}
    claim = lowest_claim(table(values, "ttft_p99"), "P", "lowest", "twp", "ttft_p99", ".2f")
    assert claim.verdict == REPRODUCED and "; priority − twp +0.50" in claim.measured
    values[("w", "vllm")] = [1.5] * 3
    claim = lowest_claim(table(values, "ttft_p99"), "P", "lowest", "twp", "ttft_p99", ".2f")
    assert claim.verdict == NOT and "; vllm − twp -0.50" in claim.measured


def test_lowest_over_workloads_combines_by_the_half_rule():
    # Workload a: twp lowest (reproduced); b: fcfs lower (not). One of two not reproduced: partly.
    values = {("a", "twp"): [2.0] * 3, ("a", "fcfs"): [3.0] * 3, ("b", "twp"): [4.0] * 3, ("b", "fcfs"): [3.0] * 3}
    claim = lowest_claim(table(values, "ttft_p99"), "P", "lowest", "twp", "ttft_p99", ".2f")
    assert claim.verdict == PARTLY and "(1 reproduced, 1 not reproduced of 2 workloads)" in claim.reason
