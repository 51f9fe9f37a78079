"""Fidelity: the same seeded workload through the real backend and through the calibrated model.

The real backend's steps are reported on two clocks: the forward pass alone and host-inclusive (packing,
forward pass and sampling). The episode metrics are those of the clock the backend gave the engine, which
by default is the clock the profile was fitted on.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.backends import LatencyModel, load_profile, step_latency
from servegym.backends.calibration_provenance import FORWARD_ONLY, HOST_INCLUSIVE, backend_clock, clock_option
from servegym.engine import STEP_INDEX, EpisodeLog
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode
from servegym.workloads import RequestSpec, Workload

if TYPE_CHECKING:
    from servegym.backends.torch_backend import TorchBackend

FIDELITY_METRICS = (
    ("ttft_p50", "TTFT P50 (s)"), ("ttft_p99", "TTFT P99 (s)"), ("e2e_p50", "E2E P50 (s)"),
    ("e2e_p99", "E2E P99 (s)"), ("itl_mean", "ITL mean (s)"), ("itl_p99", "ITL P99 (s)"),
    ("throughput_rps", "throughput (req/s)"),
)


@dataclass
class FidelityRow:
    policy: str
    metric: str
    real: float
    calibrated: float

    @property
    def relative_error(self) -> float:
        return (self.calibrated - self.real) / self.real if self.real else math.nan


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


def fidelity(policy_name: str, workload: Workload, profile: str, seed: int = 0,
             backend_options: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
             max_steps: int = 100_000, clock: str | None = None) -> tuple[list[FidelityRow], RealTiming]:
    """Run one seeded episode on both backends; return per-metric rows and the real run's timing breakdown.

    ``clock`` (``host-inclusive`` or ``forward-only``) is the real backend's; by default the one the profile
    records (the backend's own default when the profile records none)."""
    from servegym.backends.torch_backend import TorchBackend

    prof = load_profile(profile)
    profile_clock = prof.provenance.get("clock")
    engine = {"num_kv_blocks": prof.num_kv_blocks, "block_size": prof.block_size, **(engine or {})}
    summaries = {}
    real = TorchBackend(**{"num_kv_blocks": engine["num_kv_blocks"], "block_size": engine["block_size"],
                           **clock_option(clock or profile_clock),
                           **(backend_options or {})})
    for name, backend in (("torch", real), ("calibrated", None)):
        policy = make_policy(policy_name)
        env = make_env(policy, max_episode_steps=max_steps, workload=workload, profile=prof, engine=engine,
                       backend=backend)
        result = run_episode(env, policy, seed=seed)
        summaries[name] = result.summary
        if backend is real:
            timing = real_timing(real, step_residuals(result.log, prof.latency), profile_clock)
        env.close()
    rows = [FidelityRow(policy_name, m, summaries["torch"][m], summaries["calibrated"][m]) for m, _ in FIDELITY_METRICS]
    return rows, timing


def real_timing(backend: TorchBackend, residuals: tuple[StepResidual, ...],
                profile_clock: str | None = None) -> RealTiming:
    """The timing breakdown of a real backend's run from its per-step ``forward_s`` and ``overhead_s``."""
    forward, overhead = np.asarray(backend.forward_s, dtype=float), np.asarray(backend.overhead_s, dtype=float)
    clocks = (StepClock.of(FORWARD_ONLY, forward), StepClock.of(HOST_INCLUSIVE, forward + overhead))
    return RealTiming(forward.size, 1e3 * float(forward.mean()), 1e3 * float(overhead.mean()), residuals,
                      backend_clock(backend), clocks, profile_clock)


def step_residuals(log: EpisodeLog, model: LatencyModel) -> tuple[StepResidual, ...]:
    """Mean relative error (model - measured) / measured of the real run's own steps, by step type.

    Each step is re-predicted from what the step log records: decode batch, prefill tokens and KV in use
    (an upper bound on the decodes' context, since it includes prefill rows); the attention term of prefill
    chunks is left out. Large errors on one step type point at the term that misses.
    """
    steps = log.steps()
    col = {name: steps[:, STEP_INDEX[name]] for name in ("dt_s", "num_decode_tokens", "num_prefill_tokens",
                                                                "num_used_blocks")}
    ran = (col["num_decode_tokens"] > 0) | (col["num_prefill_tokens"] > 0)
    predicted = np.array([step_latency(model, int(b), p, 0.0, kv * log.block_size)
                          for b, p, kv in zip(col["num_decode_tokens"], col["num_prefill_tokens"],
                                              col["num_used_blocks"], strict=True)])
    error = (predicted - col["dt_s"]) / np.where(col["dt_s"] > 0, col["dt_s"], np.nan)
    kinds = (("decode-only steps", ran & (col["num_prefill_tokens"] == 0)),
             ("steps with prefill", ran & (col["num_prefill_tokens"] > 0)))
    return tuple(StepResidual(kind, float(np.nanmean(error[chosen])), int(chosen.sum()))
                 for kind, chosen in kinds if chosen.any())


def fidelity_table(rows: list[FidelityRow]) -> str:
    labels = dict(FIDELITY_METRICS)
    lines = ["| policy | metric | real | calibrated | relative error |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.policy} | {labels[r.metric]} | {r.real:.4f} | {r.calibrated:.4f} | "
                     f"{r.relative_error:+.1%} |")
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
        writer.writerow(["policy", "metric", "real", "calibrated", "relative_error"])
        for r in rows:
            writer.writerow([r.policy, r.metric, r.real, r.calibrated, r.relative_error])
