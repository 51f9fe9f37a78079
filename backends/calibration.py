"""Calibration: sweep a real backend, fit the calibrated latency model, write a profile with provenance.

The fit is least squares on relative error: for every candidate breakpoint ``B0`` (each measured batch
size) the decode samples are regressed on ``[1, max(0, B - B0), context tokens]`` and the ``B0`` with the
smallest squared error wins; prefill samples, minus ``l_min``, are then regressed on ``[chunk tokens,
attention work]``. Repeats are reduced to their median before fitting.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servegym.backends.base import StepBatch
from servegym.backends.calibrated import step_latency
from servegym.backends.profile import LatencyModel, Profile
from servegym.backends.token_model import prefill_attention_work

if TYPE_CHECKING:
    from servegym.backends.torch_backend import TorchBackend


@dataclass(frozen=True)
class Sample:
    """One timed iteration: ``decode`` requests holding ``context`` KV tokens in all, plus one prefill chunk."""

    decode: int
    context: float
    chunk: int
    chunk_start: int
    seconds: float

    @property
    def attention(self) -> float:
        return prefill_attention_work(np.array([self.chunk_start]), np.array([self.chunk])) if self.chunk else 0.0


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on relative error (rows weighted by 1/y, so 20 ms and 1 s steps count alike), with
    coefficients clipped at zero (dropping a negative column and refitting)."""
    keep = np.ones(x.shape[1], dtype=bool)
    w = 1.0 / np.maximum(np.abs(y), 1e-9)
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep] * w[:, None], y * w, rcond=None)[0]
        negative = keep & (coef < 0)
        if not negative.any():
            return coef
        keep &= ~negative


def fit_decode(samples: list[Sample]) -> tuple[float, int, float, float]:
    """``(l_min, B0, alpha, per-context-token)`` from decode-only samples."""
    b = np.array([s.decode for s in samples], dtype=float)
    ctx = np.array([s.context for s in samples])
    t = np.array([s.seconds for s in samples])
    best = None
    for b0 in np.unique(b):
        x = np.column_stack([np.ones_like(b), np.maximum(0.0, b - b0), ctx])
        coef = _nonneg_lstsq(x, t)
        sse = float(np.sum(((x @ coef - t) / t) ** 2))
        if best is None or sse < best[0]:
            best = (sse, int(b0), coef)
    _, b0, (l_min, alpha, per_ctx) = best
    return float(l_min), b0, float(alpha), float(per_ctx)


def fit_prefill(samples: list[Sample], l_min: float) -> tuple[float, float]:
    """``(per-token, per-token-x-context)`` from prefill-only samples."""
    x = np.column_stack([[s.chunk for s in samples], [s.attention for s in samples]]).astype(float)
    t = np.array([s.seconds for s in samples]) - l_min
    per_token, per_attention = _nonneg_lstsq(x, t)
    return float(per_token), float(per_attention)


def predict(model: LatencyModel, s: Sample) -> float:
    return step_latency(model, s.decode, s.chunk, s.attention, s.context)


def fit_errors(model: LatencyModel, samples: list[Sample]) -> dict[str, float]:
    if not samples:
        return {}
    measured = np.array([s.seconds for s in samples])
    fitted = np.array([predict(model, s) for s in samples])
    return {"rmse_ms": float(np.sqrt(np.mean((fitted - measured) ** 2)) * 1e3),
            "mean_abs_rel_error": float(np.mean(np.abs(fitted - measured) / measured)),
            "samples": len(samples)}


def medians(samples: list[Sample]) -> list[Sample]:
    """One sample per distinct configuration, at the median of its repeats (robust to timing outliers)."""
    groups: dict[tuple, list[float]] = {}
    for s in samples:
        groups.setdefault((s.decode, s.context, s.chunk, s.chunk_start), []).append(s.seconds)
    return [Sample(*key, float(np.median(times))) for key, times in groups.items()]


def fit_latency_model(decode: list[Sample], prefill: list[Sample]) -> LatencyModel:
    l_min, b0, alpha, per_ctx = fit_decode(medians(decode))
    per_token, per_attention = fit_prefill(medians(prefill), l_min)
    return LatencyModel(l_min_s=l_min, saturation_batch=max(1, b0), alpha_s=alpha, prefill_s_per_token=per_token,
                        prefill_s_per_token_context=per_attention, decode_s_per_context_token=per_ctx)


@dataclass(frozen=True)
class SweepPlan:
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    contexts: tuple[int, ...] = (32, 128, 512)
    chunks: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    chunk_starts: tuple[int, ...] = (0, 256)
    mixed: tuple[tuple[int, int], ...] = ((8, 64), (8, 256), (32, 64), (32, 256))
    repeats: int = 3


class Sweeper:
    """Drives a backend with hand-made batches (no engine) and times them."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self._next_id = 0

    def _new_ids(self, n: int) -> np.ndarray:
        ids = np.arange(self._next_id, self._next_id + n)
        self._next_id += n
        return ids

    def _prefill(self, ids: np.ndarray, tokens: int, target: int | None = None) -> None:
        """Ingest ``tokens`` prompt tokens of requests ``ids`` (whose prompts are ``target`` long) untimed."""
        empty = np.zeros(0, dtype=np.int64)
        done = 0
        while done < tokens:
            step = min(512, tokens - done)
            self.backend.execute(StepBatch(empty, empty, ids, np.full(ids.size, done), np.full(ids.size, step),
                                           np.full(ids.size, target or tokens)))
            done += step

    def decode(self, plan: SweepPlan, progress: Callable[[int], object] | None = None) -> list[Sample]:
        samples, empty = [], np.zeros(0, dtype=np.int64)
        for context in plan.contexts:
            ids = self._new_ids(max(plan.batches))
            for part in np.array_split(ids, max(1, ids.size // 16)):
                self._prefill(part, context)
            for batch in plan.batches:
                chosen = ids[:batch]
                for _ in range(plan.repeats):
                    seconds = self.backend.execute(StepBatch(chosen, empty, empty, empty, empty, empty))
                    samples.append(Sample(batch, float(batch * (context + 1)), 0, 0, seconds))
                if progress:
                    progress(f"decode B={batch} context={context}")
            self.backend.release(ids)
        return samples

    def prefill(self, plan: SweepPlan, progress: Callable[[int], object] | None = None) -> list[Sample]:
        samples, empty = [], np.zeros(0, dtype=np.int64)
        for start in plan.chunk_starts:
            for chunk in plan.chunks:
                for _ in range(plan.repeats):
                    rid = self._new_ids(1)
                    if start:
                        self._prefill(rid, start, start + chunk)
                    seconds = self.backend.execute(StepBatch(empty, empty, rid, np.array([start]), np.array([chunk]),
                                                             np.array([start + chunk])))
                    samples.append(Sample(0, 0.0, chunk, start, seconds))
                    self.backend.release(rid)
                if progress:
                    progress(f"prefill chunk={chunk} start={start}")
        return samples

    def mixed(self, plan: SweepPlan, context: int = 128) -> list[Sample]:
        samples, empty = [], np.zeros(0, dtype=np.int64)
        for batch, chunk in plan.mixed:
            ids = self._new_ids(batch)
            self._prefill(ids, context)
            for _ in range(plan.repeats):
                rid = self._new_ids(1)
                seconds = self.backend.execute(StepBatch(ids, empty, rid, np.array([0]), np.array([chunk]),
                                                         np.array([chunk])))
                samples.append(Sample(batch, float(batch * (context + 1)), chunk, 0, seconds))
                self.backend.release(rid)
            self.backend.release(ids)
        return samples


def device_name(backend: TorchBackend) -> str:
    if str(backend.device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    import torch

    return f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def calibrate(backend: TorchBackend, name: str, plan: SweepPlan | None = None, load_seconds: float | None = None,
              progress: Callable[[int], object] | None = None) -> tuple[Profile, dict[str, list[Sample]]]:
    """Sweep ``backend``, fit the latency model and build a profile with provenance and fit errors."""
    plan = plan or SweepPlan()
    sweeper = Sweeper(backend)
    sweeper.prefill(SweepPlan(chunks=(64,), chunk_starts=(0,), repeats=2))  # warm-up, discarded
    samples = {"decode": sweeper.decode(plan, progress), "prefill": sweeper.prefill(plan, progress),
               "mixed": sweeper.mixed(plan)}
    model = fit_latency_model(samples["decode"], samples["prefill"])
    provenance = {
        "hardware": device_name(backend),
        "model": f"{backend.model_name} ({backend.dtype})",
        "method": (f"servegym calibrate: decode batches {list(plan.batches)} at contexts {list(plan.contexts)}, "
                   f"prefill chunks {list(plan.chunks)} at starts {list(plan.chunk_starts)}, mixed steps "
                   f"{[list(m) for m in plan.mixed]}, {plan.repeats} repeats each; piecewise-linear least squares "
                   "with the breakpoint chosen by least squares"),
        "date": datetime.date.today().isoformat(),
        "versions": dict(backend.versions),
        "fit_error": {group: fit_errors(model, group_samples) for group, group_samples in samples.items()},
        "notes": ["mixed steps are not fitted; their error checks that decode and prefill costs add up"],
    }
    if load_seconds is not None:
        provenance["notes"].append(f"cold_start_s is the measured model build/load time, {load_seconds:.2f} s")
    profile = Profile(name, model, backend.num_kv_blocks, backend.block_size, float(load_seconds or 0.0), provenance)
    return profile, samples


def plot_fit(profile: Profile, samples: dict[str, list[Sample]], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    decode = samples["decode"]
    contexts = sorted({round(s.context / max(s.decode, 1)) for s in decode})
    for ctx in contexts:
        group = [s for s in decode if round(s.context / max(s.decode, 1)) == ctx]
        b = np.array([s.decode for s in group])
        left.scatter(b, [s.seconds * 1e3 for s in group], s=12, label=f"measured, context {ctx - 1}")
        grid = np.unique(b)
        fitted = [predict(profile.latency, Sample(int(x), float(x * ctx), 0, 0, 0.0)) * 1e3 for x in grid]
        left.plot(grid, fitted, lw=1)
    left.axvline(profile.latency.saturation_batch, ls="--", c="grey", lw=0.8, label="fitted B0")
    left.set(xlabel="decode batch size", ylabel="step latency (ms)", title="decode: measured vs fitted")
    left.legend(fontsize=7)
    for start in sorted({s.chunk_start for s in samples["prefill"]}):
        group = [s for s in samples["prefill"] if s.chunk_start == start]
        right.scatter([s.chunk for s in group], [s.seconds * 1e3 for s in group], s=12,
                      label=f"measured, start {start}")
        grid = sorted({s.chunk for s in group})
        right.plot(grid, [predict(profile.latency, Sample(0, 0.0, c, start, 0.0)) * 1e3 for c in grid], lw=1)
    right.set(xlabel="prefill chunk tokens", ylabel="step latency (ms)", title="prefill: measured vs fitted")
    right.legend(fontsize=7)
    fig.suptitle(f"{profile.name}: {profile.provenance['hardware']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
