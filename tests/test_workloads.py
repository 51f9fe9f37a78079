"""Workload generators and trace replay."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.workloads import (
    WORKLOADS,
    Choice,
    Gamma,
    MarkovModulated,
    Poisson,
    RangeMix,
    SyntheticWorkload,
    TraceWorkload,
    bundled_trace,
    make_workload,
)
from servegym.workloads.scenarios import GSM8K_SHAPED_PROMPTS, gsm8k_pairs


def test_poisson_rate_and_determinism():
    w = SyntheticWorkload(Poisson(5.0), 2000.0, prompt=Choice((10,), (1.0,)), output=Choice((5,), (1.0,)))
    a, b = w.sample(np.random.default_rng(3)), w.sample(np.random.default_rng(3))
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert len(a) / 2000.0 == pytest.approx(5.0, rel=0.05)
    gaps = np.diff(a.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


def test_gamma_burstiness_is_its_cv():
    times = Gamma(rate=4.0, cv=3.0).sample(np.random.default_rng(0), 20_000.0)
    gaps = np.diff(times)
    assert times.size / 20_000.0 == pytest.approx(4.0, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_mmpp_mean_rate():
    process = MarkovModulated(2.0, 12.0, 8.0, 3.0)
    times = process.sample(np.random.default_rng(0), 20_000.0)
    assert times.size / 20_000.0 == pytest.approx(process.mean_rate(), rel=0.05)
    assert np.all(np.diff(times) >= 0)


def test_twp_mixtures():
    rng = np.random.default_rng(0)
    prompts = Choice((50, 200, 800), (0.5, 0.3, 0.2)).sample(rng, 100_000)
    assert np.mean(prompts == 50) == pytest.approx(0.5, abs=0.01)
    g = GSM8K_SHAPED_PROMPTS.sample(rng, 100_000)
    assert np.mean((g >= 30) & (g <= 80)) == pytest.approx(0.6, abs=0.01)
    assert np.mean((g >= 350) & (g <= 512)) == pytest.approx(0.1, abs=0.01)
    assert g.min() >= 30 and g.max() <= 512
    with pytest.raises(ValueError, match="sum"):
        RangeMix(((1, 2),), (0.5,))


def test_gsm8k_lengths_come_from_the_bundled_file():
    pairs = gsm8k_pairs()
    assert len(pairs.prompts) == 8792
    assert 40 < np.mean(pairs.prompts) < 60


def test_azure_trace_replay_and_time_scaling():
    full = TraceWorkload(str(bundled_trace())).sample(np.random.default_rng(0))
    assert len(full) == 8819
    assert full.num_prompt_tokens[:3].tolist() == [4808, 3180, 110]
    assert full.num_output_tokens[:3].tolist() == [10, 8, 27]
    assert full.arrival_s[1] == pytest.approx(0.052, abs=1e-6)
    half = TraceWorkload(str(bundled_trace()), time_scale=0.5, max_requests=100).sample(np.random.default_rng(0))
    np.testing.assert_allclose(half.arrival_s, full.arrival_s[:100] * 0.5)
    cut = TraceWorkload(str(bundled_trace()), duration_s=60.0).sample(np.random.default_rng(0))
    assert cut.arrival_s.max() < 60.0 and len(cut) > 50


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_named_workload_samples(name):
    spec = make_workload(name).sample(np.random.default_rng(0))
    assert len(spec) > 10


def test_scenarios_are_ordered_by_load():
    rates = [make_workload(n).mean_rate() for n in ("low", "medium", "high")]
    assert rates == sorted(rates)
