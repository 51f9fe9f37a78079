"""Fidelity: the same seeded workload through the real backend and through the calibrated model."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servegym.backends import LatencyModel, load_profile, step_latency
from servegym.engine import STEP_FIELDS, EpisodeLog
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


def fidelity(policy_name: str, workload: Workload, profile: str, seed: int = 0,
             backend_options: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
             max_steps: int = 100_000) -> tuple[list[FidelityRow], dict[str, Any]]:
    """Run one seeded episode on both backends; return per-metric rows and the real run's timing breakdown."""
    prof = load_profile(profile)
    engine = {"num_kv_blocks": prof.num_kv_blocks, "block_size": prof.block_size, **(engine or {})}
    summaries = {}
    timing: dict[str, Any] = {}
    for backend in ("torch", "calibrated"):
        policy = make_policy(policy_name)
        extra = {"backend": "torch", "backend_options": backend_options or {}} if backend == "torch" else {}
        env = make_env(policy, max_episode_steps=max_steps, workload=workload, profile=prof, engine=engine, **extra)
        result = run_episode(env, policy, seed=seed)
        summaries[backend] = result.summary
        if backend == "torch":
            real = env.unwrapped.engine.backend
            timing = {"steps": len(real.forward_s), "forward_ms_mean": 1e3 * sum(real.forward_s) / len(real.forward_s),
                      "overhead_ms_mean": 1e3 * sum(real.overhead_s) / len(real.overhead_s),
                      "residuals": step_residuals(result.log, prof.latency)}
        env.close()
    rows = [FidelityRow(policy_name, m, summaries["torch"][m], summaries["calibrated"][m]) for m, _ in FIDELITY_METRICS]
    return rows, timing


def step_residuals(log: EpisodeLog, model: LatencyModel) -> dict[str, float]:
    """Mean relative error (model - measured) / measured of the real run's own steps, by step type.

    Each step is re-predicted from what the step log records: decode batch, prefill tokens and KV in use
    (an upper bound on the decodes' context, since it includes prefill rows); the attention term of prefill
    chunks is left out. Large errors on one step type point at the term that misses.
    """
    steps = log.steps()
    col = {name: steps[:, STEP_FIELDS.index(name)] for name in ("dt_s", "num_decode_tokens", "num_prefill_tokens",
                                                                "num_used_blocks")}
    ran = (col["num_decode_tokens"] > 0) | (col["num_prefill_tokens"] > 0)
    predicted = np.array([step_latency(model, int(b), p, 0.0, kv * log.block_size)
                          for b, p, kv in zip(col["num_decode_tokens"], col["num_prefill_tokens"],
                                              col["num_used_blocks"], strict=True)])
    error = (predicted - col["dt_s"]) / np.where(col["dt_s"] > 0, col["dt_s"], np.nan)
    out = {}
    for name, chosen in (("decode-only steps", ran & (col["num_prefill_tokens"] == 0)),
                         ("steps with prefill", ran & (col["num_prefill_tokens"] > 0))):
        if chosen.any():
            out[name] = float(np.nanmean(error[chosen]))
            out[f"{name} (count)"] = int(chosen.sum())
    return out


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
