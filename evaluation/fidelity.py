"""Fidelity: the same seeded workload through the real backend and through the calibrated model."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servegym.backends import LatencyModel, load_profile, step_latency
from servegym.engine import STEP_INDEX, EpisodeLog
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode
from servegym.workloads import Workload

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
class RealTiming:
    """Where the real backend's step time went, and how well the profile predicts its steps."""

    steps: int
    forward_ms_mean: float
    overhead_ms_mean: float
    """Packing, scheduling and bookkeeping per step, outside the model's forward pass."""
    residuals: tuple[StepResidual, ...]

    def describe(self) -> str:
        residuals = ", ".join(f"{r.kind} {r.mean_relative_error:+.1%}" for r in self.residuals)
        return (f"{self.steps} steps, forward {self.forward_ms_mean:.2f} ms, scheduling/bookkeeping "
                f"{self.overhead_ms_mean:.2f} ms per step; model error on the real steps: {residuals}")


def fidelity(policy_name: str, workload: Workload, profile: str, seed: int = 0,
             backend_options: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
             max_steps: int = 100_000) -> tuple[list[FidelityRow], RealTiming]:
    """Run one seeded episode on both backends; return per-metric rows and the real run's timing breakdown."""
    from servegym.backends.torch_backend import TorchBackend

    prof = load_profile(profile)
    engine = {"num_kv_blocks": prof.num_kv_blocks, "block_size": prof.block_size, **(engine or {})}
    summaries = {}
    real = TorchBackend(**{"num_kv_blocks": engine["num_kv_blocks"], "block_size": engine["block_size"],
                           **(backend_options or {})})
    for name, backend in (("torch", real), ("calibrated", None)):
        policy = make_policy(policy_name)
        env = make_env(policy, max_episode_steps=max_steps, workload=workload, profile=prof, engine=engine,
                       backend=backend)
        result = run_episode(env, policy, seed=seed)
        summaries[name] = result.summary
        if backend is real:
            timing = RealTiming(len(real.forward_s), 1e3 * float(np.mean(real.forward_s)),
                                1e3 * float(np.mean(real.overhead_s)), step_residuals(result.log, prof.latency))
        env.close()
    rows = [FidelityRow(policy_name, m, summaries["torch"][m], summaries["calibrated"][m]) for m, _ in FIDELITY_METRICS]
    return rows, timing


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


def write_fidelity_csv(rows: list[FidelityRow], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "metric", "real", "calibrated", "relative_error"])
        for r in rows:
            writer.writerow([r.policy, r.metric, r.real, r.calibrated, r.relative_error])
