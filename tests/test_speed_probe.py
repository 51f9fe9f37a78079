"""The speed probe (how fast the machine runs against the profile now), the calibrated backend's time scale, and
fidelity's comparison at the measured speed."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from servegym.backends import CalibratedBackend, load_profile
from servegym.backends.base import BatchTotals, StepBatch
from servegym.backends.speed_probe import MachineSpeed, describe_plan, drift_advice, machine_speed, probe_plan
from servegym.evaluation.fidelity import FidelityReport, _row, ranking, ranking_table, speed_table, verdict
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode

CPU_PROFILE = "cpu-small-llama"


@pytest.fixture(scope="module")
def profile():
    return load_profile(CPU_PROFILE)


class FakeMachine(CalibratedBackend):
    """A backend that keeps each request's KV as a real one does (the sweep's batches leave the decode contexts to
    the backend) and takes the profile's time for each step, multiplied by the next of ``factors`` in turn: a
    machine whose steps run off the fit by known amounts."""

    def __init__(self, profile, factors) -> None:
        super().__init__(profile, noise_cv=0.0)
        self.factors, self.resets, self.kv = itertools.cycle(factors), 0, {}

    def reset(self, rng) -> None:
        super().reset(rng)
        self.resets, self.kv = self.resets + 1, {}

    def release(self, request_ids) -> None:
        for rid in request_ids.tolist():
            self.kv.pop(rid, None)

    def execute(self, batch: StepBatch) -> float:
        held = np.array([self.kv[r] for r in batch.decode_ids.tolist()], dtype=np.int64)
        seconds = super().execute(batch._replace(decode_context=held)) * next(self.factors)
        for r in batch.decode_ids.tolist():
            self.kv[r] += 1
        for r, start, length, target in zip(*(a.tolist() for a in batch[2:]), strict=True):
            self.kv[r] = start + length + (start + length == target)  # a completed prompt holds its first token
        return seconds


def test_the_probe_reads_a_slower_machine_as_its_median_ratio(profile):
    # Rule: the speed is the median over the probe's timed steps of measured / predicted. Three steps in four
    # run 1.25x the fit and one in four 5x: the median says 1.25; a mean would say about 2.2, an inverted ratio
    # 0.8. (The untimed warm-up and fill steps draw factors too; 5x stays well under half of each kind's steps.)
    # The decode steps of later rounds hold a token more than the sweep's sample says, as on a real backend, and
    # their rows' mean context (128) crosses the long-context knee (129): 0.3%.
    backend = FakeMachine(profile, [1.25, 1.25, 1.25, 5.0])
    speed = machine_speed(backend, profile)
    assert (speed.decode, speed.prefill) == (pytest.approx(1.25, rel=4e-3), pytest.approx(1.25, rel=4e-3))
    assert backend.resets == 1  # the probe starts from an empty cache
    speed = machine_speed(FakeMachine(profile, [0.8]), profile)
    assert (speed.decode, speed.prefill) == (pytest.approx(0.8, rel=2e-3), pytest.approx(0.8, rel=2e-3))


def test_the_probe_reads_decode_and_prefill_steps_apart(profile):
    # Rule: decode-only steps and steps with a prefill chunk (single chunks and mixed steps) get a median each.
    class KindMachine(FakeMachine):
        def execute(self, batch: StepBatch) -> float:
            self.factors = itertools.repeat(1.3 if batch.prefill_ids.size else 0.9)
            return super().execute(batch)

    speed = machine_speed(KindMachine(profile, [1.0]), profile)
    assert (speed.decode, speed.prefill) == (pytest.approx(0.9, rel=2e-3), pytest.approx(1.3, rel=1e-12))
    assert str(MachineSpeed(0.9004, 1.2996)) == "0.900/1.300"


def test_the_probe_stays_inside_the_profiles_sweep(profile):
    shipped = probe_plan(profile)
    assert (shipped.batches, shipped.contexts, shipped.chunks, shipped.mixed) == ((1, 4, 16), (128,), (64, 256),
                                                                                 ((4, 64),))
    assert len(shipped.batches) * 3 + len(shipped.chunks) * 3 + len(shipped.mixed) * 3 == 18  # timed steps
    # A profile fitted on batches up to 2 at context 16 with 16-token steps is probed there, not extrapolated.
    small = dataclasses.replace(profile, provenance={"sweep": {"max_batch": 2, "max_context": 16, "max_tokens": 16}})
    plan = probe_plan(small)
    assert (plan.batches, plan.contexts, plan.chunks, plan.mixed, plan.mixed_context) == ((1, 2), (16,), (16,),
                                                                                          ((1, 16),), 16)
    # The decode rows' contexts spread as the profile's sweep spread them; equal where it records no spread.
    assert plan.context_spread == 0.0
    assert shipped.context_spread == profile.provenance["sweep"].get("context_spread", 0.0)
    spread = dataclasses.replace(profile, provenance={"sweep": {"max_batch": 2, "max_context": 16, "max_tokens": 16,
                                                                "context_spread": 0.5}})
    assert probe_plan(spread).context_spread == 0.5
    # What a report says the probe timed follows the plan, capped as it is.
    assert describe_plan(plan) == ("decode batches 1, 2 at context 16, prefill chunks of 16 tokens, mixed steps of 1 "
                                   "decodes and a 16-token chunk")
    assert describe_plan(probe_plan(spread)).startswith("decode batches 1, 2 at context 16 (rows spread by +-0.5 of "
                                                        "it)")
    too_small = CalibratedBackend(dataclasses.replace(profile, num_kv_blocks=8), noise_cv=0.0)
    # 16 rows spread around 128 tokens, each + 1 generated + 9 timed decodes: 145 blocks (by hand: 9, 9, 16, 2, 13,
    # 6, 14, 4, 11, 7, 15, 3, 12, 6, 13 and 5).
    with pytest.raises(ValueError, match="the sweep needs 145 KV blocks"):
        machine_speed(too_small, profile)


def test_a_time_scale_multiplies_every_step_of_its_kind_and_the_baseline(profile):
    decode, mixed = BatchTotals(3, 3 * 200.0, 0, 0.0, 0.0, 0), BatchTotals(3, 3 * 200.0, 1, 96.0, 96 * 48.5, 1)
    plain = CalibratedBackend(profile, noise_cv=0.0)
    slow = CalibratedBackend(profile, noise_cv=0.0, time_scale=1.3)
    assert slow.execute_totals(mixed) == pytest.approx(1.3 * plain.execute_totals(mixed), rel=1e-15)
    assert slow.baseline_step_s == pytest.approx(1.3 * plain.baseline_step_s, rel=1e-15)
    apart = CalibratedBackend(profile, noise_cv=0.0, time_scale=1.1, prefill_time_scale=0.7)
    assert apart.execute_totals(decode) == pytest.approx(1.1 * plain.execute_totals(decode), rel=1e-15)
    assert apart.execute_totals(mixed) == pytest.approx(0.7 * plain.execute_totals(mixed), rel=1e-15)
    assert apart.baseline_step_s == pytest.approx(1.1 * plain.baseline_step_s, rel=1e-15)  # a decode step
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="time_scale must be a finite number > 0"):
            CalibratedBackend(profile, time_scale=bad)
        with pytest.raises(ValueError, match="prefill_time_scale must be a finite number > 0"):
            CalibratedBackend(profile, prefill_time_scale=bad)


def test_the_run_at_speed_differs_from_the_plain_one_by_its_scale_alone(profile):
    # Rule: fidelity's second model run changes nothing but the step times: at scale 1 it is the plain episode,
    # noise draws included; at 1.2 the same first iteration takes 1.2x as long.
    def env_of(backend):
        policy = make_policy("fcfs")
        env = make_env(policy, workload="cpu-fidelity", profile=profile, backend=backend, max_episode_steps=400,
                       engine={"num_kv_blocks": profile.num_kv_blocks, "block_size": profile.block_size})
        return env, policy

    def summary(backend):
        env, policy = env_of(backend)
        return run_episode(env, policy, seed=3).summary

    def first_step_s(backend):
        env, policy = env_of(backend)
        obs, _ = env.reset(seed=3)
        while not env.unwrapped.cluster.engines[0].num_running:
            obs, *_ = env.step(policy.act(obs))
        return env.unwrapped.cluster.engines[0].last_dt

    plain = summary(None)
    assert summary(CalibratedBackend(profile, time_scale=1.0)) == plain
    assert summary(CalibratedBackend(profile, time_scale=1.2))["ttft_p50"] > plain["ttft_p50"]
    assert first_step_s(CalibratedBackend(profile, time_scale=1.2)) == pytest.approx(
        1.2 * first_step_s(CalibratedBackend(profile)), rel=1e-12)


def test_a_row_and_the_verdict_report_the_error_at_the_measured_speed():
    # Seed means 1.1 and 2.0 (real 1.55); the plain model 1.4 (-9.7%); at speed 1.5 and 1.9, mean 1.7 (+9.7%).
    row = _row("fcfs", "e2e_p50", [[1.0, 1.2], [2.0, 2.0]], [1.3, 1.5], [1.5, 1.9])
    assert row.real == pytest.approx(1.55) and row.at_speed == pytest.approx(1.7)
    assert row.relative_error == pytest.approx(-0.15 / 1.55) and row.error_at_speed == pytest.approx(0.15 / 1.55)
    assert math.isnan(_row("fcfs", "e2e_p50", [[1.0]], [1.0]).error_at_speed)  # no probe, no figure
    far = _row("twp", "e2e_p50", [[1.0, 1.0]], [1.5], [1.12])
    fcfs = [MachineSpeed(1.04, 0.9), MachineSpeed(0.97, 0.95), MachineSpeed(1.0, 0.88), MachineSpeed(1.1, 0.91)]
    # fcfs 1.55 and twp 1.0 separate (spreads 0.091 x 1.55 + 0); the plain model swaps them (1.4 < 1.5), the
    # model at speed keeps them (1.7 > 1.12).
    orders = ranking([row, far])
    assert [(o.same_order, o.same_order_at_speed) for o in orders] == [(False, True)]
    assert orders[0].at_speed_difference == pytest.approx(1.7 - 1.12)
    report = FidelityReport([row, far], orders, {}, (0, 1), 2,
                            {"fcfs": fcfs, "twp": [MachineSpeed(1.2, 0.8), MachineSpeed(1.3, 0.85)]})
    line = verdict(report)
    assert line.startswith("1 of 2 policy metrics within 10%")
    assert "; 0 of 1 pairs that the real runs separate beyond their spread ordered the same way;" in line
    assert line.endswith("the machine ran at 0.970-1.300x the profile's time on decode-only steps and 0.800-0.950x "
                         "on steps with prefill before the real episodes (speed probe), and at that speed the model "
                         "is within 10% on 1 of 2 and orders 1 of 1 pairs alike")
    assert ranking_table(orders).splitlines()[2] == \
        "| E2E P50 (s) | fcfs - twp | +0.5500 | -0.1000 | **no** | +0.5800 | yes |"
    assert speed_table({"fcfs": fcfs}, (0, 1), 2).splitlines() == [
        "| policy | seed 0 repeat 1 | seed 0 repeat 2 | seed 1 repeat 1 | seed 1 repeat 2 |",
        "|---|---|---|---|---|", "| fcfs | 1.040/0.900 | 0.970/0.950 | 1.000/0.880 | 1.100/0.910 |"]
    assert np.isfinite(row.error_at_speed)


def test_drift_advice_reads_each_kinds_median_against_the_limit():
    # Medians: decode 1.04 (of 0.90, 1.04, 1.30: a mean would say 1.08), prefill 0.97: both within 5%.
    held = [MachineSpeed(0.90, 0.97), MachineSpeed(1.04, 0.99), MachineSpeed(1.30, 0.80)]
    assert drift_advice(held) == ("within 5% of the profile's speed on both kinds of step: no drift the probe can "
                                  "see, read the profile as calibrated")
    # Prefill median 0.94 (6.0% faster) is past 5%, decode 1.02 is not: only prefill is named.
    moved = [MachineSpeed(1.02, 0.94), MachineSpeed(1.0, 0.93), MachineSpeed(1.05, 0.96)]
    assert drift_advice(moved) == ("steps with prefill 6.0% faster than when the profile was fitted, beyond 5%: "
                                   "recalibrate (servegym calibrate), or read fidelity's results at the measured "
                                   "machine speed")
    assert drift_advice([MachineSpeed(1.051, 1.0)]).startswith("decode-only steps 5.1% slower than")
    assert drift_advice([MachineSpeed(1.049, 0.951)]).startswith("within 5%")  # just inside 5%
    assert drift_advice([MachineSpeed(1.1, 1.1)], limit=0.2).startswith("within 20%")
    assert drift_advice([MachineSpeed(1.0, math.nan)]).startswith("steps with prefill nan%")  # unreadable: drift
    with pytest.raises(ValueError, match="at least one probe"):
        drift_advice([])

