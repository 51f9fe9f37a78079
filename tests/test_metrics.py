"""Metric functions on episodes whose answers are known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.metrics import goodput, inter_token_latencies, itl_cv, kv_utilisation, queue_growth_slope, summarize, ttft
from tests.conftest import admit_all, fixed, make

L_MIN = 0.043


def finished_log(workload, **engine):
    env = make(workload, engine=engine)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(admit_all(env))
        done = terminated or truncated
    return env.unwrapped.engine.log


def test_single_request_metrics():
    log = finished_log(fixed([0.0], [10], [11]))
    first_step = L_MIN + 10 * 1.3e-4 + 7e-9 * (10 * 11 / 2)
    assert ttft(log)[0] == pytest.approx(first_step)
    gaps = inter_token_latencies(log)[0]
    np.testing.assert_allclose(gaps, L_MIN)
    assert itl_cv(gaps) == pytest.approx(0.0, abs=1e-12)
    s = summarize(log)
    assert s["num_finished"] == 1 and s["throughput_tps"] == pytest.approx(11 / (first_step + 10 * L_MIN))
    assert s["e2e_p50"] == pytest.approx(first_step + 10 * L_MIN)


def test_itl_cv_definition():
    gaps = np.array([1.0, 1.0, 3.0, 3.0])
    assert itl_cv(gaps) == pytest.approx(0.5)
    assert np.isnan(itl_cv(np.zeros(0)))


def test_goodput_counts_only_requests_meeting_both_slos():
    log = finished_log(fixed([0.0, 0.0], [10, 2000], [5, 5]), prefill_chunk_tokens=512)
    # The long prompt takes four prefill steps: its TTFT is far above the short one's.
    t = np.sort(ttft(log))
    between = (t[0] + t[1]) / 2
    span = log.step_rows[0][-1][0]
    assert goodput(log, ttft_slo_s=between, itl_slo_s=1.0) == pytest.approx(1 / span)
    assert goodput(log, ttft_slo_s=10.0, itl_slo_s=1.0) == pytest.approx(2 / span)
    assert goodput(log, ttft_slo_s=10.0, itl_slo_s=0.001) == 0.0


def test_kv_utilisation_and_queue_slope():
    log = finished_log(fixed(np.linspace(0, 10, 50), np.full(50, 160), np.full(50, 40)),
                       num_kv_blocks=1000, block_size=16)
    mean, peak = kv_utilisation(log)
    assert 0 < mean <= peak <= 1
    assert peak == pytest.approx(log.steps()[:, 7].max() / 1000)
    assert abs(queue_growth_slope(log)) < 0.5


def test_overload_shows_a_growing_queue():
    # 30 req/s of 200-token outputs is far beyond what one engine serves: the queue must grow.
    n = 6000
    log_env = make(fixed(np.linspace(0, 200, n), np.full(n, 50), np.full(n, 200)), engine={"max_num_seqs": 16},
                   max_episode_steps=2000)
    log_env.reset(seed=0)
    for _ in range(2000):
        _, _, _, truncated, _ = log_env.step(admit_all(log_env))
        if truncated:
            break
    assert queue_growth_slope(log_env.unwrapped.engine.log) > 20.0


def test_kv_utilisation_is_time_weighted_mean_std_and_max():
    # Two iterations: 1 s at 2/10 blocks used, then 3 s at 6/10. Time-weighted mean (0.2 + 1.8) / 4 = 0.5,
    # variance (1 x 0.3^2 + 3 x 0.1^2) / 4 = 0.03; unweighted they would be 0.4 and 0.2.
    from servegym.engine import EpisodeLog, StepRow
    from servegym.metrics import kv_utilisation_stats

    one = np.ones(1)
    log = EpisodeLog(np.zeros(1), one, one, one, one, np.zeros(1, dtype=bool), num_kv_blocks=10, block_size=16)
    log.step_rows[0] = [StepRow(1.0, 1.0, 0, 0, 0, 1, 0, 2, 0, 0, 0), StepRow(4.0, 3.0, 0, 0, 0, 1, 0, 6, 0, 0, 0)]
    mean, std, peak = kv_utilisation_stats(log)
    assert mean == pytest.approx(0.5) and std == pytest.approx(math.sqrt(0.03)) and peak == pytest.approx(0.6)
