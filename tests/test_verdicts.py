"""The reproduction report's verdict rule (issue 25): a claim is reproduced only when the whole 95% CI supports it,
baselines with identical per-seed results are counted once, and the report's header states the rule.

Hand-made intervals and tables, so each case states the numbers it feeds the rule; floats are compared with
``pytest.approx`` at a relative tolerance of 1e-9 unless stated otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest

from servegym.evaluation import TaskResult
from servegym.evaluation.reproduction import (
    FLOW_METRICS,
    NOT,
    PARTLY,
    REPRODUCED,
    VERDICT_RULES,
    Claim,
    Table,
    beats_claim,
    flow_claims,
    gain_claim,
    gain_verdict,
    lowest_claim,
    near_claim,
    range_verdict,
    render,
    twp_claims,
    within_verdict,
)
from servegym.evaluation.stats import Interval, mean_ci, paired_difference, paired_ratio


def ci(mean: float, half: float) -> Interval:
    return Interval(mean, half, paired=True)


# ---------------------------------------------------------------------------------------------- "within X%"


@pytest.mark.parametrize(("mean", "half", "verdict"), [
    (0.122, 0.038, PARTLY),  # the issue's case: CI [8.4%, 16.0%] crosses 10%, labelled "reproduced" before
    (0.05, 0.02, REPRODUCED),  # CI [3%, 7%] inside
    (0.15, 0.02, NOT),  # CI [13%, 17%] outside
    (-0.05, 0.093, REPRODUCED),  # better than the reference: still within
    (0.09, 0.0, REPRODUCED),  # a zero-width CI inside
    (0.10, 0.0, REPRODUCED),  # on the edge: "within" includes it
])
def test_within_tolerance_needs_the_whole_interval(mean, half, verdict):
    assert within_verdict(ci(mean, half), 0.10) == verdict


def test_a_crossing_interval_is_never_reproduced():
    # Sweep intervals whose upper end crosses the tolerance; none may pass, whatever the lower end.
    for low in np.linspace(-0.5, 0.0999, 25):
        for high in (0.1001, 0.12, 0.5):
            interval = ci((low + high) / 2, (high - low) / 2)
            assert within_verdict(interval, 0.10) == PARTLY, (low, high)
            assert range_verdict(interval, low=0.1) != REPRODUCED, (low, high)


def test_range_verdict_checks_the_lower_edge_with_the_lower_end():
    assert range_verdict(ci(0.40, 0.10), low=0.45) == PARTLY  # CI [30%, 50%] straddles a +45% claim
    assert range_verdict(ci(0.50, 0.02), low=0.45) == REPRODUCED
    assert range_verdict(ci(0.30, 0.02), low=0.45) == NOT


@pytest.mark.parametrize(("mean", "half", "verdict"), [
    (0.50, 0.02, REPRODUCED),  # CI [48%, 52%] above +45%
    (0.40, 0.10, PARTLY),  # straddles the claim
    (0.06, 0.02, PARTLY),  # a real gain, smaller than claimed
    (0.02, 0.05, NOT),  # no gain shown
    (-0.05, 0.02, NOT),
])
def test_gain_claims(mean, half, verdict):
    assert gain_verdict(ci(mean, half), 0.45) == verdict


# ---------------------------------------------------------------------------------------------- tables


def _results(values: dict[tuple[str, str], list[float]], metrics: tuple[str, ...] = FLOW_METRICS,
             seeds: dict[str, list[int]] | None = None) -> list[TaskResult]:
    """One TaskResult per (workload, policy, seed); every metric of ``metrics`` takes the listed value (higher
    for throughput is not needed by these cases)."""
    out = []
    for (workload, policy), per_seed in values.items():
        for seed, value in zip((seeds or {}).get(policy, range(len(per_seed))), per_seed, strict=True):
            out.append(TaskResult(policy, workload, seed, {m: value for m in metrics}, np.zeros(1), np.zeros(1)))
    return out


def test_near_claim_reports_the_interval_and_labels_the_issue_case_partly():
    # Per-seed ratios to hindsight 1.10, 1.12, 1.14, 1.08, 1.16: +12.0% ± 3.9%, CI [8.1%, 15.9%] vs 10%.
    ratios = [1.10, 1.12, 1.14, 1.08, 1.16]
    table = Table(_results({("w", "flow-control-per-class"): [100 * r for r in ratios],
                            ("w", "clairvoyant-greedy"): [100.0] * 5}))
    claim = near_claim(table, "P", "near hindsight", "flow-control-per-class", "clairvoyant-greedy", "e2e_mean_all_s",
                       0.10)
    mean, half = mean_ci(np.array(ratios) - 1)
    print(f"ratio CI: {mean:+.4f} ± {half:.4f}")
    assert mean - half < 0.10 < mean + half
    assert claim.verdict == PARTLY
    assert f"CI [{mean - half:.1%}, {mean + half:.1%}] vs tolerance 10%" in claim.measured
    assert "paired per seed" in claim.reason


def test_identical_baselines_are_counted_once_and_named_together():
    # mc and mc-sf identical on every compared metric; amin differs; the policy beats all three.
    table = Table(_results({("w", "flow-control"): [1.0, 1.1, 0.9], ("w", "mc"): [5.0, 5.2, 4.9],
                            ("w", "mc-sf"): [5.0, 5.2, 4.9], ("w", "amin"): [3.0, 3.1, 2.8]}))
    assert table.equivalence_groups("w", ["mc", "mc-sf", "amin"], FLOW_METRICS) == [["mc", "mc-sf"], ["amin"]]
    claim = beats_claim(table, "P", "beats", "flow-control", ["mc", "mc-sf", "amin"], "e2e_mean_all_s", FLOW_METRICS)
    assert claim.measured.startswith("better in 2 and worse in 0 of 2 (baseline, workload) pairs")
    assert "mc = mc-sf (identical per-seed results)" in claim.measured
    assert claim.verdict == REPRODUCED


def test_baselines_equal_on_one_metric_but_not_another_stay_apart():
    results = _results({("w", "flow-control"): [1.0, 1.1, 0.9], ("w", "mc"): [5.0, 5.2, 4.9],
                        ("w", "mc-sf"): [5.0, 5.2, 4.9]})
    for r in results:
        if r.policy == "mc-sf":
            r.metrics["kv_util_std"] += 0.01  # one compared metric differs
    table = Table(results)
    assert table.equivalence_groups("w", ["mc", "mc-sf"], FLOW_METRICS) == [["mc"], ["mc-sf"]]
    claim = beats_claim(table, "P", "beats", "flow-control", ["mc", "mc-sf"], "e2e_mean_all_s", FLOW_METRICS)
    assert claim.measured.startswith("better in 2 and worse in 0 of 2")
    assert "identical" not in claim.measured.split(";", 1)[1]


def test_a_seed_apart_is_not_identical():
    # Same values, but mc-sf ran seeds 1..3 and mc 0..2: not the same per-seed results.
    table = Table(_results({("w", "mc"): [5.0, 5.2, 4.9], ("w", "mc-sf"): [5.0, 5.2, 4.9]},
                           seeds={"mc": [0, 1, 2], "mc-sf": [1, 2, 3]}))
    assert table.equivalence_groups("w", ["mc", "mc-sf"], FLOW_METRICS) == [["mc"], ["mc-sf"]]


def test_beats_needs_the_whole_difference_interval_above_zero():
    # Policy ahead of mc on average (+0.2) but the paired CI crosses zero: not a win.
    table = Table(_results({("w", "flow-control"): [1.0, 2.0, 0.5], ("w", "mc"): [1.5, 1.8, 0.8]}))
    claim = beats_claim(table, "P", "beats", "flow-control", ["mc"], "e2e_mean_all_s", FLOW_METRICS)
    assert claim.verdict == NOT and claim.measured.startswith("better in 0 and worse in 0 of 1")


def test_lowest_claim_needs_every_difference_to_exclude_zero():
    # twp has the lowest mean, but its paired difference to fcfs crosses zero: partly, not reproduced.
    table = Table(_results({("w", "twp"): [1.0, 2.0, 0.5], ("w", "fcfs"): [1.5, 1.8, 0.8],
                            ("w", "priority"): [9.0, 9.5, 9.2]}, metrics=("ttft_p99",)))
    assert lowest_claim(table, "P", "lowest", "twp", "ttft_p99", ".2f").verdict == PARTLY
    clear = Table(_results({("w", "twp"): [1.0, 1.1, 0.9], ("w", "fcfs"): [1.5, 1.8, 1.6]}, metrics=("ttft_p99",)))
    assert lowest_claim(clear, "P", "lowest", "twp", "ttft_p99", ".2f").verdict == REPRODUCED
    worse = Table(_results({("w", "twp"): [2.0, 2.1, 1.9], ("w", "fcfs"): [1.5, 1.8, 1.6]}, metrics=("ttft_p99",)))
    assert lowest_claim(worse, "P", "lowest", "twp", "ttft_p99", ".2f").verdict == NOT


def test_gain_claim_through_a_table():
    # TWP's throughput 1.40, 1.50, 1.45 times ServerlessLLM's: +45% ± 12%, straddling the +45% claim.
    table = Table(_results({("w", "twp"): [1.40, 1.50, 1.45], ("w", "serverless-llm"): [1.0, 1.0, 1.0]},
                           metrics=("throughput_rps",)))
    claim = gain_claim(table, "P", "+45%", "twp", ["serverless-llm"], "throughput_rps", 0.45)
    assert claim.verdict == PARTLY and "CI [" in claim.measured


def test_a_gain_over_a_baseline_that_served_nothing_is_not_reproduced_not_a_crash():
    # A run cut off before any request finished: the baseline's throughput is 0 on seed 1 (the mean of its two
    # members, 0 and 0), so no ratio exists there; the other workload still gets its interval.
    table = Table(_results({("w", "twp"): [1.5, 0.2, 1.4], ("w", "fcfs"): [1.0, 0.0, 1.0],
                            ("w", "priority"): [1.0, 0.0, 1.0], ("v", "twp"): [2.0, 2.0, 2.0],
                            ("v", "fcfs"): [1.0, 1.0, 1.0], ("v", "priority"): [1.0, 1.0, 1.0]},
                           metrics=("throughput_rps",)))
    claim = gain_claim(table, "P", "+45%", "twp", ["fcfs", "priority"], "throughput_rps", 0.45)
    assert claim.verdict == PARTLY  # w not reproduced, v reproduced (+100%, CI of zero width, above +45%)
    assert "w: the baselines' throughput_rps is 0 on seed(s) [1], no gain to measure" in claim.measured
    assert "v: +100%" in claim.measured


def test_paired_intervals_use_the_seeds_and_say_so():
    # Both sides swing together with the seed: the paired difference is exact, the unpaired one wide.
    a, b = {0: 10.0, 1: 20.0, 2: 30.0}, {0: 9.0, 1: 19.0, 2: 29.0}
    paired = paired_difference(a, b)
    assert paired.paired and paired.mean == pytest.approx(1.0) and paired.half == pytest.approx(0.0, abs=1e-12)
    shifted = {s + 1: v for s, v in b.items()}
    unpaired = paired_difference(a, shifted)
    assert not unpaired.paired and unpaired.mean == pytest.approx(1.0) and unpaired.half > 10
    ratio = paired_ratio({0: 2.0, 1: 4.0, 2: 6.0}, {0: 1.0, 1: 2.0, 2: 3.0})
    assert ratio.paired and ratio.mean == pytest.approx(1.0) and ratio.half == pytest.approx(0.0, abs=1e-12)
    table = Table(_results({("w", "flow-control"): [10.0, 20.0, 30.0], ("w", "mc"): [11.0, 21.0, 31.0]},
                           seeds={"flow-control": [0, 1, 2], "mc": [1, 2, 3]}))
    claim = beats_claim(table, "P", "beats", "flow-control", ["mc"], "e2e_mean_all_s", FLOW_METRICS)
    assert "1 of 1 unpaired (different seeds)" in claim.reason and claim.verdict == NOT


def test_the_header_states_the_rule():
    text = render([Claim("P", "c", "m", REPRODUCED, "r")], [], [])
    header = text.split("| paper |")[0]
    for rule in VERDICT_RULES:
        assert rule in header
    assert "whole CI lies inside" in header and "counted once" in header


def test_mc_sf_is_left_out_of_unknown_length_claims_and_fcfs_is_the_throttles_check():
    # mc-sf is far worse only with unknown lengths (the paper runs it with known lengths): the unknown-length
    # workload compares flow control with mc alone; fcfs, behind flow control on every seed, is the throttle check.
    fc, fcfs = [10.0, 11.0, 12.0], [14.0, 15.5, 16.0]
    table = Table(_results({("w/known", "flow-control"): fc, ("w/known", "mc"): [13.0, 14.0, 15.0],
                            ("w/known", "mc-sf"): [12.5, 13.0, 14.5], ("w/known", "alpha-protection"): fc,
                            ("w/known", "amin"): [11.0, 12.5, 12.0], ("w/known", "fcfs"): fcfs,
                            ("w/known", "clairvoyant-greedy"): fc,
                            ("w/unknown", "flow-control"): fc, ("w/unknown", "mc"): [90.0, 91.0, 92.0],
                            ("w/unknown", "mc-sf"): [95.0, 96.0, 97.0], ("w/unknown", "alpha-protection"): fc,
                            ("w/unknown", "amin"): fc, ("w/unknown", "fcfs"): fcfs,
                            ("w/unknown", "clairvoyant-greedy"): fc}))
    claims = {c.claim.split(" (")[0]: c for c in flow_claims(table, "s")}
    latency = claims["beats alpha-protection greedy, MC, MC-SF and A_min on latency"]
    unknown = latency.measured.split("w/unknown: ", 1)[1]
    assert "mc-sf" not in unknown and "mc " in unknown
    assert "mc-sf" in latency.measured.split("w/unknown: ", 1)[0]
    throttle = claims["the throttle pays: flow control beats unthrottled FCFS admission on latency"]
    assert throttle.verdict == REPRODUCED and throttle.measured.startswith("better in 2 and worse in 0 of 2")


def test_twp_p99_ttft_claim_is_against_the_three_the_papers_figure_shows_above_it():
    # The paper's figure has Priority and FCFS below TWP at P99: the claim is checked against the other three only.
    per = {"twp": [1.0, 1.1, 1.2], "round-robin": [2.0, 2.1, 2.2], "dynamic-batch": [1.5, 1.7, 1.8],
           "serverless-llm": [3.0, 3.0, 3.1], "priority": [0.5, 0.6, 0.5], "fcfs": [0.7, 0.8, 0.9]}
    table = Table(_results({("w", p): v for p, v in per.items()}, metrics=("ttft_p99", "itl_cv", "throughput_rps")))
    claim = next(c for c in twp_claims(table, "c") if "P99 TTFT" in c.claim)
    assert claim.verdict == REPRODUCED and claim.measured.startswith("better in 3 and worse in 0 of 3")
    assert "priority" not in claim.measured and "fcfs" not in claim.measured


def test_best_measured_is_the_per_seed_lowest_of_every_policy():
    table = Table(_results({("w", "a"): [5.0, 1.0, 4.0], ("w", "b"): [2.0, 3.0, 6.0], ("w", "c"): [9.0, 9.0, 3.0]}))
    envelope = table.with_envelope("best", "e2e_mean_all_s")
    assert envelope.cells("w", "best", "e2e_mean_all_s") == {0: 2.0, 1: 1.0, 2: 3.0}
    assert envelope.policies[-1] == "best" and "best" not in table.policies


def test_flow_claims_rank_by_latency_over_every_request_not_the_finished_few():
    # alpha-protection a=0.0 finishes few requests fast (e2e_mean 1) but leaves the rest waiting (censored 100);
    # a=0.1 serves everyone (censored 20). The grid's best is a=0.1, and flow control (censored 10) beats it.
    results = _results({("w/known", "flow-control"): [10.0, 10.5, 11.0], ("w/known", "alpha-protection a=0.0"):
                        [100.0, 101.0, 99.0], ("w/known", "alpha-protection a=0.1"): [20.0, 21.0, 22.0],
                        ("w/known", "fcfs"): [30.0, 31.0, 29.0], ("w/known", "clairvoyant-greedy"): [9.5, 10.0, 10.5]})
    for r in results:
        r.metrics["e2e_mean"] = 1.0 if r.policy == "alpha-protection a=0.0" else r.metrics["e2e_mean_all_s"]
    claims = flow_claims(Table(results), "s")
    assert "w/known: alpha-protection a=0.1" in claims[0].measured
    assert claims[0].verdict == REPRODUCED and "alpha-protection +10" in claims[0].measured
    # Near hindsight against the per-seed best measured (the clairvoyant packer here): 10/9.5, 10.5/10, 11/10.5.
    near = next(c for c in claims if c.claim.startswith("comes near hindsight"))
    assert near.verdict == REPRODUCED and "+5.0%" in near.measured
