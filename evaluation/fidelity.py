"""Fidelity: the same seeded workloads through the real backend and through the calibrated model.

Every policy runs on every seed, ``repeats`` times on the real backend (its repeats differ only by the clock:
their spread is the noise floor) and once on the calibrated model. Each metric's error is the model's mean over
the seeds against the real means, with the real repeats' spread and the per-seed errors beside it. The ranking
check takes every pair of policies and metric the real runs separate by more than their spreads and asks
whether the model orders them alike. Nothing differs between the two sides but the backend: the same policy,
workload, seeds, engine settings and KV cache.

The real backend's steps are reported on two clocks: the forward pass alone and host-inclusive (packing,
forward pass and sampling). The episode metrics are those of the clock the backend gave the engine, which
by default is the clock the profile was fitted on. Each real step is also re-priced by the profile from its
own batch (:func:`step_residuals`), which points at the term that misses.

A shared machine's speed drifts, and a profile fitted at one time carries that drift into every metric checked at
another. Before each real episode the speed probe (:mod:`servegym.backends.speed_probe`) times a few sweep steps
against the profile; the model's episode on each seed is run a second time at the speed the probes measured for
that seed (decode-only steps and steps with prefill each scaled by their probes' mean), so the report separates
the model's shape from the machine's speed at the time of the check.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.backends import CalibratedBackend, LatencyModel, Profile, TokenLatencyModel, load_profile
from servegym.backends.base import BatchTotals
from servegym.backends.calibration_provenance import FORWARD_ONLY, HOST_INCLUSIVE, clock_option
from servegym.backends.speed_probe import MachineSpeed, machine_speed
from servegym.metrics import metric as metric_of
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode
from servegym.workloads import RequestSpec, Workload

if TYPE_CHECKING:
    from servegym.backends.torch_backend import TorchBackend

FIDELITY_METRICS = ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "itl_mean", "itl_p50", "itl_p99", "throughput_rps")
"""The metrics compared (headers from ``servegym.metrics.METRICS``; values in base units, seconds)."""
TOLERANCE = 0.10
"""The calibrated model passes a metric when its mean lies within this relative error of the real backend's."""


@dataclass(frozen=True)
class FidelityRow:
    """One policy's metric over the seeds: the real backend's mean (over seeds of each seed's mean over repeats),
    the calibrated model's, and how far the real repeats of one seed disagree."""

    policy: str
    metric: str
    real: float
    calibrated: float
    spread: float = math.nan
    """Median over seeds of ``(max - min) / mean`` of a seed's real repeats (nan with one repeat)."""
    seed_errors: tuple[float, ...] = ()
    """The calibrated model's relative error on each seed alone."""
    at_speed: float = math.nan
    """The calibrated model's mean over the seeds run at the machine speed the probes measured (nan: no probe)."""

    @property
    def relative_error(self) -> float:
        return (self.calibrated - self.real) / self.real if self.real else math.nan

    @property
    def error_at_speed(self) -> float:
        """The relative error of the model run at the measured machine speed."""
        return (self.at_speed - self.real) / self.real if self.real else math.nan


@dataclass(frozen=True)
class PairOrder:
    """Two policies whose real runs differ on ``metric`` by more than their repeat spread, and whether the
    calibrated model orders them the same way."""

    metric: str
    first: str
    second: str
    real_difference: float
    """``first - second`` on the real backend (means over seeds)."""
    calibrated_difference: float
    at_speed_difference: float = math.nan
    """``first - second`` of the model run at the measured machine speed (nan: no probe)."""

    @property
    def same_order(self) -> bool:
        return _same_sign(self.real_difference, self.calibrated_difference)

    @property
    def same_order_at_speed(self) -> bool:
        """Whether the model run at the measured machine speed orders the pair as the real runs do."""
        return _same_sign(self.real_difference, self.at_speed_difference)


def _same_sign(real: float, model: float) -> bool:
    """``model`` has ``real``'s sign (a tie, or nan, does not)."""
    return math.copysign(1.0, real) == math.copysign(1.0, model) and model != 0.0 and not math.isnan(model)


def ranking(rows: Sequence[FidelityRow]) -> list[PairOrder]:
    """Every pair of policies and metric where the real means differ by more than the sum of their absolute
    repeat spreads (``spread x real`` each; 0 where unmeasured), in row order."""
    by_metric: dict[str, list[FidelityRow]] = {}
    for row in rows:
        by_metric.setdefault(row.metric, []).append(row)
    orders = []
    for metric, group in by_metric.items():
        for a, b in itertools.combinations(group, 2):
            noise = sum(0.0 if math.isnan(r.spread) else r.spread * abs(r.real) for r in (a, b))
            if abs(a.real - b.real) > noise:
                orders.append(PairOrder(metric, a.policy, b.policy, a.real - b.real, a.calibrated - b.calibrated,
                                        a.at_speed - b.at_speed))
    return orders


@dataclass(frozen=True)
class StepResidual:
    """The calibrated model's mean relative error on one kind of the real run's steps."""

    kind: str
    """``decode-only steps`` or ``steps with prefill``."""
    mean_relative_error: float
    count: int


@dataclass(frozen=True)
class StepClock:
    """The real run's step latency on one clock, in milliseconds."""

    clock: str
    mean_ms: float
    p50_ms: float
    p99_ms: float

    @classmethod
    def of(cls, clock: str, seconds: np.ndarray) -> StepClock:
        ms = 1e3 * np.asarray(seconds, dtype=float)
        return cls(clock, float(ms.mean()), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)))


@dataclass(frozen=True)
class RealTiming:
    """Where the real backend's step time went, and how well the profile predicts its steps."""

    steps: int
    forward_ms_mean: float
    overhead_ms_mean: float
    """Host work per step outside the model's forward pass: packing, index copies, sampling, bookkeeping."""
    residuals: tuple[StepResidual, ...]
    clock: str
    """The clock the engine ran on, so the clock of the real run's episode metrics."""
    clocks: tuple[StepClock, ...]
    """Per-step latency forward-only and host-inclusive."""
    profile_clock: str | None = None
    """The clock the profile was fitted on (None: not recorded)."""

    def describe(self) -> str:
        residuals = ", ".join(f"{r.kind} {r.mean_relative_error:+.1%}" for r in self.residuals)
        fitted = f"profile fitted on {self.profile_clock}" if self.profile_clock else "profile's clock not recorded"
        mismatch = " (MISMATCH: the comparison mixes clocks)" if self.profile_clock not in (None, self.clock) else ""
        return (f"{self.steps} steps, forward {self.forward_ms_mean:.2f} ms, host work (packing, sampling, "
                f"bookkeeping) {self.overhead_ms_mean:.2f} ms per step; model error on the real steps: {residuals}; "
                f"episode metrics on the {self.clock} clock, {fitted}{mismatch}")


@dataclass(frozen=True)
class FirstRequests:
    """The first ``count`` requests of every episode of ``workload`` (a short fidelity run)."""

    workload: Workload
    count: int

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        spec, n = self.workload.sample(rng), self.count
        return RequestSpec(spec.arrival_s[:n], spec.num_prompt_tokens[:n], spec.num_output_tokens[:n])


@dataclass
class RealSteps:
    """Every step the real backend ran over several episodes: forward and host seconds, and the batch's totals
    (what :func:`real_timing` and :func:`step_residuals` read)."""

    count_host_time: bool
    forward_s: list[float] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)
    totals: list[BatchTotals] = field(default_factory=list)

    def add(self, backend: TorchBackend) -> None:
        self.forward_s += backend.forward_s
        self.overhead_s += backend.overhead_s
        self.totals += backend.totals


@dataclass(frozen=True)
class FidelityReport:
    rows: list[FidelityRow]
    orders: list[PairOrder]
    timings: dict[str, RealTiming]
    seeds: tuple[int, ...]
    repeats: int
    speeds: dict[str, list[MachineSpeed]] = field(default_factory=dict)
    """Per policy, the probe's machine speed (measured / profile) before each real episode, in running order."""


def _episode(policy_name: str, workload: Workload, profile: Profile, engine: dict[str, Any], seed: int,
             backend: TorchBackend | CalibratedBackend | None, max_steps: int) -> dict[str, float]:
    policy = make_policy(policy_name)
    env = make_env(policy, max_episode_steps=max_steps, workload=workload, profile=profile, engine=engine,
                   backend=backend)
    try:
        return run_episode(env, policy, seed=seed).summary
    finally:
        env.close()


def fidelity(policies: Sequence[str], workload: Workload, profile: str, seeds: Sequence[int] = (0, 1, 2),
             repeats: int = 2, backend_options: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
             max_steps: int = 100_000, clock: str | None = None,
             progress: Callable[[str], object] | None = None) -> FidelityReport:
    """Run every policy on every seed ``repeats`` times on the real backend and once on the calibrated model
    (seeded: a profile's noise draws from the episode's seed); compare the means over seeds, metric by metric, and
    the policies' order.

    ``clock`` (``host-inclusive`` or ``forward-only``) is the real backend's; by default the one the profile
    records (the backend's own default when the profile records none)."""
    if not policies or not seeds or repeats < 1:
        raise ValueError(f"fidelity needs policies, seeds and repeats >= 1; got {policies}, {seeds}, {repeats}")
    prof = load_profile(profile)
    profile_clock = prof.provenance.get("clock")
    engine = {"num_kv_blocks": prof.num_kv_blocks, "block_size": prof.block_size, **(engine or {})}
    real = real_backend(prof, engine["num_kv_blocks"], engine["block_size"], clock, backend_options)
    rows, timings, speeds = [], {}, {}
    for name in policies:
        steps = RealSteps(real.count_host_time)
        runs: dict[str, list[list[float]]] = {m: [] for m in FIDELITY_METRICS}
        modelled: dict[str, list[float]] = {m: [] for m in FIDELITY_METRICS}
        at_speed: dict[str, list[float]] = {m: [] for m in FIDELITY_METRICS}
        speeds[name] = []
        for seed in seeds:
            repeated = []
            for repeat in range(repeats):
                speeds[name].append(machine_speed(real, prof))
                repeated.append(_episode(name, workload, prof, engine, seed, real, max_steps))
                steps.add(real)
                if progress:
                    progress(f"{name} seed {seed} repeat {repeat + 1}/{repeats}: machine at "
                             f"{speeds[name][-1]}x the profile's step time (decode/prefill); real backend, "
                             f"E2E P50 {repeated[-1]['e2e_p50']:.3f} s")
            calibrated = _episode(name, workload, prof, engine, seed, None, max_steps)
            probes = speeds[name][-repeats:]
            at = CalibratedBackend(prof, time_scale=float(np.mean([p.decode for p in probes])),
                                   prefill_time_scale=float(np.mean([p.prefill for p in probes])))
            scaled = _episode(name, workload, prof, engine, seed, at, max_steps)
            for metric in FIDELITY_METRICS:
                runs[metric].append([r[metric] for r in repeated])
                modelled[metric].append(calibrated[metric])
                at_speed[metric].append(scaled[metric])
        rows += [_row(name, metric, runs[metric], modelled[metric], at_speed[metric]) for metric in FIDELITY_METRICS]
        timings[name] = real_timing(steps, step_residuals(steps, prof.latency), profile_clock)
    return FidelityReport(rows, ranking(rows), timings, tuple(seeds), repeats, speeds)


def real_backend(profile: Profile, num_kv_blocks: int, block_size: int, clock: str | None = None,
                 backend_options: dict[str, Any] | None = None) -> TorchBackend:
    """The real backend a profile is checked against: on ``clock``, by default the one the profile records."""
    from servegym.backends.torch_backend import TorchBackend

    return TorchBackend(**{"num_kv_blocks": num_kv_blocks, "block_size": block_size,
                           **clock_option(clock or profile.provenance.get("clock")), **(backend_options or {})})


def speed_check(profile: str, probes: int = 3, clock: str | None = None,
                backend_options: dict[str, Any] | None = None) -> list[MachineSpeed]:
    """The speed probe alone, ``probes`` times: how fast the real backend runs now against ``profile`` (seconds,
    where a fidelity run takes minutes)."""
    prof = load_profile(profile)
    real = real_backend(prof, prof.num_kv_blocks, prof.block_size, clock, backend_options)
    return [machine_speed(real, prof) for _ in range(probes)]


def _row(policy: str, metric: str, real: list[list[float]], calibrated: list[float],
         at_speed: list[float] | None = None) -> FidelityRow:
    """``real[seed][repeat]``, ``calibrated[seed]`` and ``at_speed[seed]`` reduced to one row."""
    seed_means = [float(np.mean(r)) for r in real]
    spreads = [(max(r) - min(r)) / abs(m) for r, m in zip(real, seed_means, strict=True) if len(r) > 1 and m]
    errors = tuple((c - m) / m if m else math.nan for c, m in zip(calibrated, seed_means, strict=True))
    return FidelityRow(policy, metric, float(np.mean(seed_means)), float(np.mean(calibrated)),
                       float(np.median(spreads)) if spreads else math.nan, errors,
                       float(np.mean(at_speed)) if at_speed else math.nan)


def real_timing(steps: RealSteps, residuals: tuple[StepResidual, ...],
                profile_clock: str | None = None) -> RealTiming:
    """The timing breakdown of a real backend's steps from their ``forward_s`` and ``overhead_s``."""
    forward, overhead = np.asarray(steps.forward_s, dtype=float), np.asarray(steps.overhead_s, dtype=float)
    clocks = (StepClock.of(FORWARD_ONLY, forward), StepClock.of(HOST_INCLUSIVE, forward + overhead))
    return RealTiming(forward.size, 1e3 * float(forward.mean()), 1e3 * float(overhead.mean()), residuals,
                      HOST_INCLUSIVE if steps.count_host_time else FORWARD_ONLY, clocks, profile_clock)


def step_residuals(steps: RealSteps, model: LatencyModel | TokenLatencyModel) -> tuple[StepResidual, ...]:
    """Mean relative error (model - measured) / measured of the real steps, by step type, each step priced from
    its own batch's totals on the clock the engine ran on. Large errors on one type point at the term that
    misses."""
    measured = np.asarray(steps.forward_s, dtype=float)
    if steps.count_host_time:
        measured = measured + np.asarray(steps.overhead_s, dtype=float)
    predicted = np.array([model.totals_s(t) for t in steps.totals])
    prefill = np.array([t.num_prefills > 0 for t in steps.totals], dtype=bool)
    error = (predicted - measured) / np.where(measured > 0, measured, np.nan)
    kinds = (("decode-only steps", ~prefill), ("steps with prefill", prefill))
    return tuple(StepResidual(kind, float(np.nanmean(error[chosen])), int(chosen.sum()))
                 for kind, chosen in kinds if chosen.any())


def _base_header(name: str) -> str:
    """The metric's header with its unit as stored (these tables print seconds, not the header's ms)."""
    m = metric_of(name)
    return m.header if m.scale == 1.0 else m.header.replace(f"({m.unit})", "(s)")


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.1%}"


def fidelity_table(rows: list[FidelityRow], tolerance: float = TOLERANCE) -> str:
    labels = {m: _base_header(m) for m in FIDELITY_METRICS}
    lines = ["| policy | metric | real | calibrated | relative error | per seed | real repeat spread | within "
             f"{tolerance:.0%} | at the measured machine speed |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seeds = " / ".join(_pct(e) for e in r.seed_errors)
        spread = "n/a" if math.isnan(r.spread) else f"{r.spread:.1%}"
        ok = "yes" if abs(r.relative_error) <= tolerance else "**no**"
        lines.append(f"| {r.policy} | {labels[r.metric]} | {r.real:.4f} | {r.calibrated:.4f} | "
                     f"{_pct(r.relative_error)} | {seeds} | {spread} | {ok} | {_pct(r.error_at_speed)} |")
    return "\n".join(lines)


def _signed(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.4f}"


def ranking_table(orders: list[PairOrder]) -> str:
    labels = {m: _base_header(m) for m in FIDELITY_METRICS}
    lines = ["| metric | pair | real difference | calibrated difference | same order | at the measured machine speed "
             "| same order at that speed |", "|---|---|---|---|---|---|---|"]
    for o in orders:
        lines.append(f"| {labels[o.metric]} | {o.first} - {o.second} | {o.real_difference:+.4f} | "
                     f"{o.calibrated_difference:+.4f} | {'yes' if o.same_order else '**no**'} | "
                     f"{_signed(o.at_speed_difference)} | {'yes' if o.same_order_at_speed else '**no**'} |")
    return "\n".join(lines)


def verdict(report: FidelityReport, tolerance: float = TOLERANCE) -> str:
    """One line: how many metrics lie within ``tolerance`` and how many ordered pairs the model keeps."""
    within = sum(abs(r.relative_error) <= tolerance for r in report.rows)
    kept = sum(o.same_order for o in report.orders)
    worst = max(report.rows, key=lambda r: abs(r.relative_error))
    line = (f"{within} of {len(report.rows)} policy metrics within {tolerance:.0%} of the real backend (worst: "
            f"{worst.policy} {_base_header(worst.metric)} {_pct(worst.relative_error)}); {kept} of "
            f"{len(report.orders)} pairs that the real runs separate beyond their spread ordered the same way; "
            f"seeds {list(report.seeds)}, {report.repeats} real repeats each")
    probes = [x for run in report.speeds.values() for x in run]
    if not probes:
        return line
    at_speed = sum(abs(r.error_at_speed) <= tolerance for r in report.rows)
    kept_at_speed = sum(o.same_order_at_speed for o in report.orders)
    decode, prefill = [p.decode for p in probes], [p.prefill for p in probes]
    return (f"{line}; the machine ran at {min(decode):.3f}-{max(decode):.3f}x the profile's time on decode-only "
            f"steps and {min(prefill):.3f}-{max(prefill):.3f}x on steps with prefill before the real episodes (speed "
            f"probe), and at that speed the model is within {tolerance:.0%} on {at_speed} of {len(report.rows)} and "
            f"orders {kept_at_speed} of {len(report.orders)} pairs alike")


def speed_table(speeds: dict[str, list[MachineSpeed]], seeds: Sequence[int], repeats: int) -> str:
    """The probe's machine speed before each real episode (decode-only / with prefill), per policy, in running
    order."""
    lines = ["| policy | " + " | ".join(f"seed {s} repeat {r + 1}" for s in seeds for r in range(repeats)) + " |",
             "|---|" + "---|" * (len(seeds) * repeats)]
    for policy, run in speeds.items():
        lines.append(f"| {policy} | " + " | ".join(str(x) for x in run) + " |")
    return "\n".join(lines)


def timing_table(timings: dict[str, RealTiming]) -> str:
    """Per-step latency of each policy's real run on both clocks; the engine's clock is marked."""
    lines = ["| policy | clock | steps | mean (ms) | P50 (ms) | P99 (ms) |", "|---|---|---|---|---|---|"]
    for policy, timing in timings.items():
        for c in timing.clocks:
            used = " (engine clock)" if c.clock == timing.clock else ""
            lines.append(f"| {policy} | {c.clock}{used} | {timing.steps} | {c.mean_ms:.2f} | {c.p50_ms:.2f} | "
                         f"{c.p99_ms:.2f} |")
    return "\n".join(lines)


def write_fidelity_csv(rows: list[FidelityRow], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "metric", "real", "calibrated", "relative_error", "real_repeat_spread",
                         "seed_errors", "calibrated_at_speed", "relative_error_at_speed"])
        for r in rows:
            writer.writerow([r.policy, r.metric, r.real, r.calibrated, r.relative_error, r.spread,
                             " ".join(f"{e:.6g}" for e in r.seed_errors), r.at_speed, r.error_at_speed])
