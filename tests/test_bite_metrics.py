"""Metric definitions on asymmetric logs: staggered arrivals, queueing before admission, a preemption, outputs
of different lengths, steps of different durations. Every expected number is worked out by hand below.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.engine import EpisodeLog, State
from servegym.engine.log import StepRow
from servegym.metrics import (
    e2e_latency,
    goodput,
    inter_token_latencies,
    itl_cv,
    kv_utilisation,
    kv_utilisation_stats,
    makespan,
    percentiles,
    queue_growth_slope,
    summarize,
    ttft,
)
from servegym.runner import make_env
from tests.conftest import fixed, flat_profile

# ------------------------------------------------------------------------------------------------ a hand log
# One container, 10 KV blocks of 16 tokens, six iterations that end at t = 4, 5, 6, 8, 12, 20 (so they last
# 1, 1, 1, 2, 4, 8 s; the first starts at the first arrival, t = 3). Six requests:
#
#   req  arrival  admitted  tokens at (step: time)          output  e2e        TTFT       TPOT = (finish-first)/(out-1)
#   0    3        3         0:4  1:5                         2       5-3 = 2    4-3 = 1    (5-4)/1  = 1
#   1    3.5      4         1:5  2:6  3:8                    3       8-3.5=4.5  5-3.5=1.5  (8-5)/2  = 1.5
#   2    4        5         2:6  3:8 | preempted | 4:12      3       12-4 = 8   6-4 = 2    (12-6)/2 = 3
#   3    4        8         4:12 5:20                        2       20-4 = 16  12-4 = 8   (20-12)/1 = 8
#   4    5        6         3:8                              1       8-5 = 3    8-5 = 3    (one token: 0)
#   5    19       -         -                                4       (still waiting when the log ends)
#
# Measured from admission instead of arrival, e2e would be 2, 4, 7, 12, 2 and TTFT 1, 1, 1, 4, 2.
ENDS = [4.0, 5.0, 6.0, 8.0, 12.0, 20.0]
DT = [1.0, 1.0, 1.0, 2.0, 4.0, 8.0]
USED = [2, 4, 6, 8, 5, 1]  # KV blocks in use after each step (of 10)
WAITING = [3, 3, 2, 1, 0, 1]  # after each step: {1,2,3}, {2,3,4}, {3,4}, {3}, {}, {5}


def hand_log() -> EpisodeLog:
    log = EpisodeLog(np.array([3.0, 3.5, 4.0, 4.0, 5.0, 19.0]), np.array([10, 20, 30, 40, 50, 60]),
                     np.array([2, 3, 3, 2, 1, 4]), np.array([2, 3, 3, 2, 1, 4]), np.array([2, 3, 3, 2, 1, 4]),
                     np.zeros(6, dtype=bool), 10, 16)
    log.state[:] = [State.FINISHED] * 5 + [State.WAITING]
    log.admit_s[:] = [3.0, 4.0, 5.0, 8.0, 6.0, np.nan]
    log.first_token_s[:] = [4.0, 5.0, 6.0, 12.0, 8.0, np.nan]
    log.finish_s[:] = [5.0, 8.0, 12.0, 20.0, 8.0, np.nan]
    log.num_preemptions[2] = 1
    log.container[:] = 0
    for req, first, last in [(0, 0, 1), (1, 1, 3), (2, 2, 3), (4, 3, 3), (2, 4, 4), (3, 4, 5)]:
        log.seg_req.append(req)
        log.seg_first.append(first)
        log.seg_last.append(last)
    decoded = [1, 2, 2, 3, 2, 1]
    for i in range(6):
        log.step_rows[0].append(StepRow(ENDS[i], DT[i], decoded[i], 0, 0, 2, WAITING[i], USED[i], 1, 0, 0))
    return log


def test_hand_log_is_consistent():
    log = hand_log()
    times = log.all_token_times()
    for r in range(5):
        assert times[r].size == log.num_output_tokens[r]
        assert times[r][0] == log.first_token_s[r] and times[r][-1] == log.finish_s[r]
    assert times[5].size == 0


def test_e2e_is_measured_from_arrival():
    log = hand_log()
    assert sorted(e2e_latency(log).tolist()) == [2.0, 3.0, 4.5, 8.0, 16.0]


def test_ttft_is_measured_from_arrival():
    log = hand_log()
    assert sorted(ttft(log).tolist()) == [1.0, 1.5, 2.0, 3.0, 8.0]


def test_percentiles_interpolate_linearly_and_p99_is_p99():
    # e2e sorted: 2, 3, 4.5, 8, 16 (n = 5): the p-th percentile sits at rank p/100 * (n - 1), interpolated.
    #   p50: rank 2          -> 4.5
    #   p95: rank 3.8        -> 8 + 0.8 (16 - 8)  = 14.4
    #   p99: rank 3.96       -> 8 + 0.96 (16 - 8) = 15.68
    # (nearest rank would give 16 for both tails, "lower" 8.)
    out = percentiles(e2e_latency(hand_log()), "e2e")
    assert out == pytest.approx({"e2e_p50": 4.5, "e2e_p95": 14.4, "e2e_p99": 15.68}, rel=1e-12)
    assert all(math.isnan(v) for v in percentiles(np.zeros(0), "x").values())


def test_summary_of_the_hand_log():
    s = summarize(hand_log(), ttft_slo_s=1.5, itl_slo_s=1.5)
    span = 20.0 - 3.0  # makespan: first arrival to the end of the last iteration
    # TTFT sorted 1, 1.5, 2, 3, 8: p50 = 2; p95 = 3 + 0.8 (8 - 3) = 7; p99 = 3 + 0.96 (8 - 3) = 7.8.
    assert (s["ttft_p50"], s["ttft_p95"], s["ttft_p99"]) == pytest.approx((2.0, 7.0, 7.8), rel=1e-12)
    assert (s["e2e_p50"], s["e2e_p95"], s["e2e_p99"]) == pytest.approx((4.5, 14.4, 15.68), rel=1e-12)
    assert s["e2e_mean"] == pytest.approx((2 + 4.5 + 8 + 16 + 3) / 5)
    # Inter-token gaps (request 2's preemption stall included): 1 | 1, 2 | 2, 4 | 8 -> 1, 1, 2, 2, 4, 8.
    # Mean 3; population variance (4 + 4 + 1 + 1 + 1 + 25) / 6 = 6; CV = sqrt(6) / 3.
    # p50 at rank 2.5 of 6 values: 2; p99 at rank 4.95: 4 + 0.95 (8 - 4) = 7.8. (No itl_p95 in the summary.)
    assert s["itl_mean"] == pytest.approx(3.0)
    assert s["itl_cv"] == pytest.approx(math.sqrt(6) / 3, rel=1e-12)
    assert (s["itl_p50"], s["itl_p99"]) == pytest.approx((2.0, 7.8), rel=1e-12)
    assert "itl_p95" not in s
    assert s["makespan_s"] == span
    assert s["throughput_rps"] == pytest.approx(5 / span)
    assert s["throughput_tps"] == pytest.approx((2 + 3 + 3 + 2 + 1) / span)  # request 5's 4 tokens never came
    assert (s["num_finished"], s["num_unfinished"], s["num_rejected"], s["num_preemptions"]) == (5, 1, 0, 1)
    # Goodput at TTFT <= 1.5 and TPOT <= 1.5: requests 0 (1, 1) and 1 (1.5, 1.5); 2 misses TTFT (2).
    assert s["goodput_rps"] == pytest.approx(2 / span)


def test_inter_token_latencies_per_request():
    gaps = inter_token_latencies(hand_log())
    assert [g.tolist() for g in gaps] == [[1.0], [1.0, 2.0], [2.0, 4.0], [8.0], [], []]


def test_itl_cv_is_the_population_coefficient_of_variation():
    # Gaps 1, 2, 6: mean 3, population variance (4 + 1 + 9) / 3 = 14/3, CV = sqrt(14/3) / 3 = 0.7201
    # (the sample variance, 14/2, would give 0.8819).
    assert itl_cv(np.array([1.0, 2.0, 6.0])) == pytest.approx(math.sqrt(14 / 3) / 3, rel=1e-12)


def test_goodput_divides_decode_time_by_output_minus_one():
    log = hand_log()
    span = 17.0
    # TPOT per request 1, 1.5, 3, 8, 0. At ITL SLO 1.2 only request 0 passes (TTFT SLO 2 passes 0, 1, 2).
    # Dividing by the output length instead (0.5, 1, 2, 4, 0.2) would also pass request 1.
    assert goodput(log, ttft_slo_s=2.0, itl_slo_s=1.2) == pytest.approx(1 / span)
    # TTFT from arrival: 1, 1.5, 2, 8, 3. At TTFT SLO 1.2 only request 0 passes; from admission (1, 1, 1, 4, 2)
    # requests 1 and 2 would pass too.
    assert goodput(log, ttft_slo_s=1.2, itl_slo_s=10.0) == pytest.approx(1 / span)
    # Both SLOs loose: the five finished requests.
    assert goodput(log, ttft_slo_s=100.0, itl_slo_s=100.0) == pytest.approx(5 / span)


def test_makespan_starts_at_the_first_arrival():
    assert makespan(hand_log()) == 17.0


def test_kv_utilisation_is_time_weighted():
    # Used fractions 0.2, 0.4, 0.6, 0.8, 0.5, 0.1 held for 1, 1, 1, 2, 4, 8 s:
    # (0.2 + 0.4 + 0.6 + 1.6 + 2.0 + 0.8) / 17 = 5.6 / 17 = 0.3294 (the plain step mean would be 0.4333).
    mean, peak = kv_utilisation(hand_log())
    assert mean == pytest.approx(5.6 / 17, rel=1e-12)
    assert peak == pytest.approx(0.8)


def test_kv_utilisation_std_is_time_weighted():
    # Same fractions and durations. Weighted mean of squares: (0.04 + 0.16 + 0.36 + 0.64 * 2 + 0.25 * 4 + 0.01 * 8)
    # / 17 = 2.92 / 17; variance 2.92/17 - (5.6/17)^2 = (49.64 - 31.36) / 289 = 18.28 / 289, std sqrt(18.28) / 17
    # = 0.2515 (the plain standard deviation of the six fractions would be 0.2357).
    mean, std, peak = kv_utilisation_stats(hand_log())
    assert (mean, peak) == pytest.approx((5.6 / 17, 0.8), rel=1e-12)
    assert std == pytest.approx(math.sqrt(18.28) / 17, rel=1e-12)
    assert summarize(hand_log())["kv_util_std"] == pytest.approx(std)


def test_queue_growth_slope_is_the_least_squares_slope():
    # Queue lengths 3, 3, 2, 1, 0, 1 at t = 4, 5, 6, 8, 12, 20. With n = 6, sum t = 55, sum q = 10,
    # sum tq = 12 + 15 + 12 + 8 + 0 + 20 = 67, sum t^2 = 685:
    # slope = (6 * 67 - 55 * 10) / (6 * 685 - 55^2) = -148 / 1085.
    assert queue_growth_slope(hand_log()) == pytest.approx(-148 / 1085, rel=1e-9)


# ------------------------------------------------------------------------------------ an engine-made episode
def test_staggered_arrivals_queue_behind_a_single_seat():
    # One seat (max_num_seqs = 1), 43 ms per iteration, no prefill cost. Requests arrive at 0, 0.01 and 0.2 s
    # with outputs 3, 2, 1 and are served one after another:
    #   steps 0-2 (t 0 -> 0.129): request 0, first token at 0.043, done at 0.129;
    #   request 1 (arrived 0.01) is admitted at 0.129: first token 0.172, done 0.215;
    #   request 2 (arrived 0.2) is admitted at 0.215: first and only token at 0.258.
    L = 0.043
    env = make_env(None, workload=fixed([0.0, 0.01, 0.2], [10, 10, 10], [3, 2, 1]), profile=flat_profile(),
                   engine={"max_num_seqs": 1})
    env.reset(seed=0)
    done = False
    while not done:
        _, _, done, _, _ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
    log = env.unwrapped.cluster.log
    np.testing.assert_allclose(log.admit_s, [0.0, 3 * L, 5 * L], rtol=1e-12)
    np.testing.assert_allclose(ttft(log), [L, 4 * L - 0.01, 6 * L - 0.2], rtol=1e-12)
    np.testing.assert_allclose(e2e_latency(log), [3 * L, 5 * L - 0.01, 6 * L - 0.2], rtol=1e-12)
    s = summarize(log, ttft_slo_s=0.1, itl_slo_s=1.0)
    # TTFTs 0.043, 0.162, 0.058: two meet 0.1 s; makespan 0.258 s.
    assert s["goodput_rps"] == pytest.approx(2 / (6 * L))
    assert s["ttft_p50"] == pytest.approx(6 * L - 0.2)
    # Blocks in use after each of the 6 equal iterations (of 12,000): request 0 holds 1 after steps 0 and 1 and
    # frees it on finishing in step 2; request 1 holds 1 after step 3, none after 4; request 2 finishes in its
    # one step. So 1, 1, 0, 1, 0, 0: mean 0.5 / 12,000, peak 1 / 12,000.
    assert kv_utilisation(log) == pytest.approx((0.5 / 12_000, 1 / 12_000))
