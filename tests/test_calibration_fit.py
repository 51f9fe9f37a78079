"""Calibration's schema-2 fit on synthetic timings from a known model, its hold-out rule, and fidelity's
per-seed rows, ranking comparison and step residuals, each worked out by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from servegym.backends import TokenLatencyModel
from servegym.backends.base import BatchTotals
from servegym.backends.calibration_fit import Sample, fit_errors, fit_token_model, medians, predict, split_holdout
from servegym.backends.calibration_sweep import SweepPlan
from servegym.evaluation.fidelity import FidelityRow, RealSteps, _row, ranking, step_residuals

KV_BYTES, PAIR_FLOPS = 16_384.0, 24_576.0
KNOTS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)
# A convex linear term (per-token cost rising with the step's size, as a CPU's caches make it) with a jump from
# one row to two (a matrix-vector kernel giving way to a matrix-matrix one).
LINEAR = (0.0, *(0.012 + 0.0019 * (t - 1) + 2e-7 * (t - 1) ** 2 for t in KNOTS[1:]))
C0, C1, KV_S, PAIR_S = 0.004, 0.0003, 2e-6, 5e-7
C_MIXED = 0.002
"""Host seconds a step pays when it holds decodes and prefills together (each kind's attention runs apart)."""


def truth() -> TokenLatencyModel:
    return TokenLatencyModel(
        cpu_rows=(1.0, 64.0), cpu_s=(C0 + C1, C0 + 64 * C1), linear_tokens=KNOTS, linear_s=LINEAR,
        allreduce_s=(0.0,) * len(KNOTS), kv_bytes_per_token=KV_BYTES, decode_bandwidth_bytes_s=KV_BYTES / KV_S,
        attention_flops_per_pair=PAIR_FLOPS, prefill_flops_s=PAIR_FLOPS / PAIR_S, lm_head_bytes=0.0,
        lm_head_flops_per_row=0.0, memory_bandwidth_bytes_s=KV_BYTES / KV_S, peak_flops_s=PAIR_FLOPS / PAIR_S,
        cpu_tail_s_per_row=C1, cpu_s_mixed_step=C_MIXED)


def sweep(model: TokenLatencyModel, rng: np.random.Generator, noise: float = 0.005) -> dict[str, list[Sample]]:
    """The default CPU sweep's points, 3 repeats each, timed by ``model`` with multiplicative noise."""
    plan = SweepPlan()

    def timed(decode: int, context: float, chunk: int, start: int, prompts: int = 1) -> list[Sample]:
        s = Sample(decode, context, chunk, start, 0.0, prompts)
        return [Sample(decode, context, chunk, start, predict(model, s) * (1 + noise * rng.standard_normal()),
                       prompts) for _ in range(plan.repeats)]

    return {
        "decode": [x for c in plan.contexts for b in plan.batches for x in timed(b, float(b * (c + 1)), 0, 0)],
        "prefill": [x for s in plan.chunk_starts for c in plan.chunks for x in timed(0, 0.0, c, s)],
        "batched": [x for n, c in plan.batched for x in timed(0, 0.0, c, 0, n)],
        "mixed": [x for b, c in plan.mixed for x in timed(b, float(b * (plan.mixed_context + 1)), c, 0)],
    }


def fit_sweep(samples: dict[str, list[Sample]]):
    fitted = [p for group in samples.values() for p in split_holdout(group)[0]]
    return fit_token_model(fitted, KV_BYTES, PAIR_FLOPS)


def test_the_long_context_term_by_hand():
    # Knee 100 tokens, 1e-4 s per step and 1e-5 s per row per token above it. Four decodes at 150 tokens each:
    # 50 tokens over, 50 x (1e-4 + 4 x 1e-5) = 7 ms more than the model without the term. At 90 tokens: nothing.
    base = truth()
    long = dataclasses.replace(base, long_context_tokens=100.0, long_context_s_per_token=1e-4,
                               long_context_s_per_row_token=1e-5)
    assert long.decode_s(4, 150.0) - base.decode_s(4, 150.0) == pytest.approx(7e-3, abs=1e-12)
    assert long.decode_s(4, 90.0) == base.decode_s(4, 90.0)
    assert long.terms(4, 4, 600.0, 0.0, 4)["decode_attention"] - base.terms(4, 4, 600.0, 0.0, 4)[
        "decode_attention"] == pytest.approx(7e-3, abs=1e-12)
    # A mixed step: 3 decodes (mean 200 tokens, 100 over) beside 2 prefill chunks; only the decodes count:
    # 100 x (1e-4 + 3 x 1e-5) = 13 ms.
    mixed = BatchTotals(3, 600.0, 2, 64.0, 1000.0, 2)
    assert long.totals_s(mixed) - base.totals_s(mixed) == pytest.approx(13e-3, abs=1e-12)


def test_the_fit_recovers_a_long_context_term_above_the_second_longest_context():
    # The default sweep's decode contexts per row are 33, 129 and 513: the knee is 129.
    known = dataclasses.replace(truth(), long_context_tokens=129.0, long_context_s_per_token=8e-6,
                                long_context_s_per_row_token=1.5e-6)
    fit = fit_sweep(sweep(known, np.random.default_rng(1)))
    assert fit.model.long_context_tokens == 129.0
    for name, true in (("long_context_s_per_token", 8e-6), ("long_context_s_per_row_token", 1.5e-6)):
        value, error = fit.terms[name]
        assert getattr(fit.model, name) == value and abs(value - true) < 3 * error and error < 0.3 * true, name


def test_the_fit_recovers_every_term_of_a_known_schema_2_model():
    samples = sweep(truth(), np.random.default_rng(0))
    fit = fit_sweep(samples)
    model = fit.model
    assert model.linear_tokens == KNOTS  # 1, every decode-only and single-prefill token count
    # cpu: c0 + c1 at one row, c0 + 64 c1 at 64 rows; the per-row slope continues past the sweep (the batched
    # prefills, 16 rows of 128 tokens against one chunk of 2048, pin it too).
    assert fit.terms["cpu_s_per_step"][0] == pytest.approx(C0, rel=0.05)
    assert fit.terms["cpu_s_per_row"][0] == pytest.approx(C1, rel=0.05)
    assert model.cpu_tail_s_per_row == pytest.approx(C1, rel=0.05)
    # The mixed steps' own cost, pinned by the mixed points alone (three fitted): within three standard errors,
    # each under a fifth of the value.
    value, error = fit.terms["cpu_s_mixed_step"]
    assert model.cpu_s_mixed_step == value and 0 < error < 0.2 * C_MIXED and abs(value - C_MIXED) < 3 * error
    np.testing.assert_allclose(model.linear_s[1:], LINEAR[1:], rtol=0.05)
    assert model.kv_bytes_per_token / model.decode_bandwidth_bytes_s == pytest.approx(KV_S, rel=0.05)
    assert model.attention_flops_per_pair / model.prefill_flops_s == pytest.approx(PAIR_S, rel=0.05)
    for name in ("cpu_s_per_step", "cpu_s_per_row", "kv_s_per_token", "s_per_pair"):
        value, error = fit.terms[name]
        assert 0 < error < 0.05 * value, name  # 0.5% noise: each term known to well within 5%
    # The held-out points, which the fit never saw, are predicted as well as the noise allows.
    for group in samples.values():
        held = split_holdout(group)[1]
        assert held and fit_errors(model, held)["max_abs_rel_error"] < 0.02


def test_without_noise_the_fit_is_exact_and_round_trips_as_a_profile_term_set():
    model = fit_sweep(sweep(truth(), np.random.default_rng(1), noise=0.0)).model
    for s in (Sample(48, 48 * 300.0, 0, 0, 0.0), Sample(20, 20 * 129.0, 200, 100, 0.0), Sample(0, 0.0, 400, 50, 0.0)):
        assert predict(model, s) == pytest.approx(predict(truth(), s), rel=1e-6)


def test_the_fit_is_not_fooled_into_a_flat_decode_by_a_cpu_only_model():
    # A model whose decode reads KV at 100 TB/s (0.16 ns a token: nothing) and pays 1 ms a request: the fit must
    # put the decode's growth in cpu, not in the KV term.
    flat = TokenLatencyModel(
        cpu_rows=(1.0, 64.0), cpu_s=(0.011, 0.074), linear_tokens=KNOTS, linear_s=LINEAR,
        allreduce_s=(0.0,) * len(KNOTS), kv_bytes_per_token=KV_BYTES, decode_bandwidth_bytes_s=1e14,
        attention_flops_per_pair=PAIR_FLOPS, prefill_flops_s=PAIR_FLOPS / PAIR_S, lm_head_bytes=0.0,
        lm_head_flops_per_row=0.0, memory_bandwidth_bytes_s=1e14, peak_flops_s=PAIR_FLOPS / PAIR_S,
        cpu_tail_s_per_row=0.001)
    fit = fit_sweep(sweep(flat, np.random.default_rng(2), noise=0.0))
    assert fit.terms["cpu_s_per_row"][0] == pytest.approx(0.001, rel=1e-4)
    assert fit.terms["kv_s_per_token"][0] == pytest.approx(KV_BYTES / 1e14, abs=1e-11)


def test_too_few_points_are_refused():
    with pytest.raises(ValueError, match="at least 4 sweep points, got 3"):
        fit_token_model([Sample(1, 33.0, 0, 0, 0.01)] * 3, KV_BYTES, PAIR_FLOPS)


def test_holdout_takes_every_fifth_point_from_the_third_of_the_medians():
    # 12 distinct points, repeats 0.3/0.1/0.2 x their index: medians 0.2 x index; held out: indices 2 and 7.
    samples = [Sample(b, float(b), 0, 0, f * b) for b in range(1, 13) for f in (0.3, 0.1, 0.2)]
    assert [p.seconds for p in medians(samples)] == pytest.approx([0.2 * b for b in range(1, 13)])
    fitted, held = split_holdout(samples)
    assert [p.decode for p in held] == [3, 8]
    assert [p.decode for p in fitted] == [1, 2, 4, 5, 6, 7, 9, 10, 11, 12]


# ------------------------------------------------------------------------------------------- fidelity


def test_a_row_averages_seeds_and_takes_the_median_repeat_spread():
    # Seed 0: repeats 1.0 and 1.2 (mean 1.1, spread 0.2 / 1.1); seed 1: 2.0, 2.0 (spread 0); seed 2: 3.0, 2.4
    # (mean 2.7, spread 0.6 / 2.7). Real mean (1.1 + 2.0 + 2.7) / 3 = 1.9333; the model 1.0, 2.2, 2.7: mean
    # 1.9667. Median spread 0.2 / 1.1 = 0.1818; per seed errors -1/11, +0.1, 0.
    row = _row("fcfs", "e2e_p50", [[1.0, 1.2], [2.0, 2.0], [3.0, 2.4]], [1.0, 2.2, 2.7])
    assert row.real == pytest.approx(5.8 / 3) and row.calibrated == pytest.approx(5.9 / 3)
    assert row.spread == pytest.approx(0.2 / 1.1)
    assert row.seed_errors == pytest.approx((-1 / 11, 0.1, 0.0))
    assert row.relative_error == pytest.approx((5.9 - 5.8) / 5.8)
    assert math.isnan(_row("fcfs", "e2e_p50", [[1.0], [2.0]], [1.0, 2.0]).spread)  # one repeat: unmeasured


def test_ranking_compares_only_pairs_the_real_runs_separate_beyond_their_spread():
    rows = [
        # E2E: a 4.0 (spread 5% -> 0.2), b 5.0 (spread 10% -> 0.5), c 4.6 (spread 0 -> 0).
        FidelityRow("a", "e2e_p50", 4.0, 3.0, 0.05), FidelityRow("b", "e2e_p50", 5.0, 3.5, 0.10),
        FidelityRow("c", "e2e_p50", 4.6, 2.9, 0.0),
        # Throughput: x and y differ by 0.1 with spreads summing to 0.2 + 0.1: not separated.
        FidelityRow("a", "throughput_rps", 2.0, 2.0, 0.1), FidelityRow("b", "throughput_rps", 2.1, 1.0, 0.05),
    ]
    orders = ranking(rows)
    # a-b: |4 - 5| = 1 > 0.2 + 0.5, model 3.0 < 3.5: same. a-c: 0.6 > 0.2, model 3.0 > 2.9: swapped.
    # b-c: 0.4 < 0.5 + 0: not separated. Throughput: 0.1 < 0.2 + 0.105: not separated.
    assert [(o.metric, o.first, o.second, o.same_order) for o in orders] == [
        ("e2e_p50", "a", "b", True), ("e2e_p50", "a", "c", False)]
    assert orders[0].real_difference == pytest.approx(-1.0)
    assert orders[1].calibrated_difference == pytest.approx(0.1)


def test_a_model_that_ties_what_the_real_runs_separate_does_not_keep_their_order():
    # A tie's difference is +0.0, whose sign matches a positive real difference: a tie must still not count.
    for real_a, real_b in ((1.0, 2.0), (2.0, 1.0)):
        orders = ranking([FidelityRow("a", "itl_mean", real_a, 2.0, 0.0),
                          FidelityRow("b", "itl_mean", real_b, 2.0, 0.0)])
        assert len(orders) == 1 and not orders[0].same_order
        assert not orders[0].same_order_at_speed  # no probe ran (nan, whose sign bit is +): no order at speed


def test_step_residuals_price_each_real_step_from_its_own_batch():
    model = truth()
    decode = BatchTotals(4, 400.0, 0, 0.0, 0.0, 0)
    mixed = BatchTotals(2, 100.0, 1, 32.0, 32 * 16.5, 1)
    d, m = model.totals_s(decode), model.totals_s(mixed)
    # Host-inclusive: measured = forward + overhead. The decode ran 25% slower than the model says (model error
    # -20%); the mixed step exactly as modelled.
    steps = RealSteps(True, [d * 1.25 - 0.001, m - 0.002], [0.001, 0.002], [decode, mixed])
    residuals = {r.kind: (r.mean_relative_error, r.count) for r in step_residuals(steps, model)}
    assert residuals["decode-only steps"] == (pytest.approx(-0.2), 1)
    assert residuals["steps with prefill"] == (pytest.approx(0.0, abs=1e-12), 1)
    # Forward-only: the overhead is not part of the measured time.
    forward = {r.kind: r.mean_relative_error for r in step_residuals(RealSteps(False, [d, m], [0.5, 0.5],
                                                                                [decode, mixed]), model)}
    assert forward == {"decode-only steps": pytest.approx(0.0, abs=1e-12),
                       "steps with prefill": pytest.approx(0.0, abs=1e-12)}


def test_the_repeats_jitter_becomes_the_models_noise() -> None:
    from servegym.backends.calibration_provenance import repeat_noise

    # Two points, log-times hand-picked: point A's logs are mean +- 0.1 (two at each), point B's mean +- 0.2
    # (one each side). Pooled: (4 x 0.01 + 2 x 0.04) / ((4 - 1) + (2 - 1)) = 0.03, sigma = sqrt(0.03).
    a = [Sample(4, 132.0, 0, 0, 0.05 * math.exp(d)) for d in (0.1, -0.1, 0.1, -0.1)]
    b = [Sample(0, 0.0, 64, 0, 0.2 * math.exp(d)) for d in (0.2, -0.2)]
    lone = [Sample(0, 0.0, 128, 0, 0.3)]  # one repeat: no degrees of freedom
    noise = repeat_noise({"decode": a, "prefill": b + lone})
    assert noise["sigma_log"] == pytest.approx(math.sqrt(0.03), rel=1e-12)
    assert noise["cv"] == pytest.approx(math.sqrt(math.exp(0.03) - 1), rel=1e-12)
    assert (noise["points"], noise["degrees_of_freedom"]) == (2, 4)
    assert repeat_noise({"prefill": lone})["cv"] == 0.0
    assert "measured_cv" not in noise
    # Repeats 1 and 3 (log spread +-ln(3)/2, sigma^2 = 2 x (ln 3 / 2)^2 / 1 = 0.6035): cv sqrt(e^0.6035 - 1) =
    # sqrt(0.8285) = 0.9102, under the limit of 1; repeats 1 and 4: sigma^2 = (ln 4)^2 / 2 = 0.9609, cv
    # sqrt(e^0.9609 - 1) = sqrt(1.6141) = 1.2705, over it.
    under = repeat_noise({"decode": [Sample(4, 132.0, 0, 0, t) for t in (1.0, 3.0)]})
    assert under["cv"] == pytest.approx(0.9102, abs=1e-4) and "measured_cv" not in under
    over = repeat_noise({"decode": [Sample(4, 132.0, 0, 0, t) for t in (1.0, 4.0)]})
    assert over["cv"] == 1.0 and over["measured_cv"] == pytest.approx(1.2705, abs=1e-4)
    assert "busy machine" in over["capped"]


def test_the_noise_estimate_recovers_a_known_log_normal_jitter() -> None:
    rng = np.random.default_rng(7)
    cv = 0.1
    sigma = math.sqrt(math.log1p(cv * cv))
    samples = [Sample(b, 33.0 * b, 0, 0, 0.01 * b * math.exp(sigma * rng.standard_normal() - sigma**2 / 2))
               for b in range(1, 61) for _ in range(5)]
    from servegym.backends.calibration_provenance import repeat_noise

    assert repeat_noise({"decode": samples})["cv"] == pytest.approx(cv, rel=0.1)  # 240 degrees of freedom


def test_a_step_mixing_decodes_and_prefills_pays_its_host_cost_by_hand() -> None:
    model = truth()
    # 10 rows (cpu knots 1 and 64: C0 + 10 C1), 2 of them prefilling beside 8 decodes: one mixed-step cost.
    assert model.terms(10, 200.0, 0.0, 0.0, 0, prefill_rows=2)["cpu"] == pytest.approx(C0 + 10 * C1 + C_MIXED)
    assert model.terms(10, 200.0, 0.0, 0.0, 0, prefill_rows=10)["cpu"] == pytest.approx(C0 + 10 * C1)  # no decodes
    free = dataclasses.replace(model, cpu_s_mixed_step=0.0)
    mixed = BatchTotals(5, 500.0, 3, 96.0, 1500.0, 3)
    assert model.totals_s(mixed) - free.totals_s(mixed) == pytest.approx(C_MIXED, rel=1e-9)
    for alone in (BatchTotals(5, 500.0, 0, 0.0, 0.0, 0), BatchTotals(0, 0.0, 3, 96.0, 1500.0, 3)):
        assert model.totals_s(alone) == free.totals_s(alone)
    assert model.prefill_s(100, batch=4) == free.prefill_s(100, batch=4)
