"""Calibration: sweep a real backend, fit the schema-2 token model, write a profile with provenance.

The parts live beside this module: the sweep (:mod:`~servegym.backends.calibration_sweep`), the fit
(:mod:`~servegym.backends.calibration_fit`), and the clock, machine and repeat spread the profile records beside
the fit (:mod:`~servegym.backends.calibration_provenance`). This module adds the machine's load during the sweep.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servegym.backends.calibration_fit import Sample, fit_errors, fit_token_model, predict, split_holdout
from servegym.backends.calibration_provenance import (
    loadavg,
    machine,
    point_spreads,
    repeat_noise,
    spread_summary,
    spread_warning,
)
from servegym.backends.calibration_sweep import SCATTER_ROWS, WARMUP_CHUNK, Sweeper, SweepPlan, point_label
from servegym.backends.profile import Profile
from servegym.backends.runtimes import LEGACY_RUNTIME

if TYPE_CHECKING:
    from servegym.backends.torch_backend import TorchBackend


def model_constants(backend: TorchBackend) -> tuple[float, float]:
    """``(KV bytes per token, attention FLOPs per (query, key) pair)`` of the backend's model, over all layers:
    the physical sizes the fit's effective bandwidth and FLOP rate divide."""
    cfg = backend.model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return backend.block_bytes / backend.block_size, 4.0 * heads * head_dim * cfg.num_hidden_layers


def calibrate(backend: TorchBackend, name: str, plan: SweepPlan | None = None, load_seconds: float | None = None,
              progress: Callable[[str], object] | None = None,
              build_seconds: float | None = None) -> tuple[Profile, dict[str, list[Sample]]]:
    """Sweep ``backend``, fit the token model on all but the held-out points and build a profile with provenance,
    fit errors on the fitted and the held-out points, and each scalar term's standard error.

    ``load_seconds`` is the measured load of a checkpoint (the profile's cold start; None: 0, as for a preset
    whose weights are randomly initialised); ``build_seconds`` the time the backend took to build, recorded."""
    plan = plan or SweepPlan()
    plan.check_fits(backend.num_kv_blocks, backend.block_size)
    sweeper = Sweeper(backend)
    load_before, wall, cpu = loadavg(), time.perf_counter(), time.process_time()
    sweeper.prefill(SweepPlan(chunks=(WARMUP_CHUNK,), chunk_starts=(0,), repeats=2))  # warm-up, discarded
    sweeper.scatter(min(backend.num_kv_blocks, plan.kv_blocks_needed(backend.block_size)), np.random.default_rng(0),
                    rows=min(plan.max_step_tokens(), SCATTER_ROWS))
    samples = {"decode": sweeper.decode(plan, progress), "prefill": sweeper.prefill(plan, progress),
               "batched": sweeper.batched(plan), "mixed": sweeper.mixed(plan)}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    split = {group: split_holdout(group_samples) for group, group_samples in samples.items()}
    fit = fit_token_model([p for fitted, _ in split.values() for p in fitted], *model_constants(backend))
    noise = repeat_noise(samples)
    model = dataclasses.replace(fit.model, noise_cv=noise["cv"])
    points = point_spreads(samples)
    host = machine(backend)
    hardware = host["device_name"] if backend.is_cuda else \
        f"CPU: {host['device_name']}, {host['threads']} thread{'s' * (host['threads'] != 1)}"
    provenance = {
        "hardware": hardware,
        "model": f"{backend.model_name} ({backend.dtype})",
        "method": (f"servegym calibrate: decode batches {list(plan.batches)} at contexts {list(plan.contexts)}, "
                   f"prefill chunks {list(plan.chunks)} at starts {list(plan.chunk_starts)}, batched prefills "
                   f"{[list(b) for b in plan.batched]} (prompts, tokens), mixed steps "
                   f"{[list(m) for m in plan.mixed]}, the decode rows' contexts spread by +-{plan.context_spread:g} of "
                   f"each point's, {plan.repeats} repeats each in rounds (median), the cache's "
                   "free blocks shuffled first (scattered KV, as a running server's), timed on the "
                   f"{host['clock']} clock; the schema-2 token model (cpu = c0 + c1 x rows, piecewise-linear "
                   "linear(T), KV-read and query-key-pair terms, a long-context term above the sweep's "
                   "second-longest decode context) by non-negative least squares on relative error, "
                   "every fifth point of each group held out"),
        "date": datetime.date.today().isoformat(),
        **host,
        "sweep": {"max_batch": max(plan.batches), "max_context": max(plan.contexts),
                  "max_tokens": max(plan.chunks), "repeats": plan.repeats, "context_spread": plan.context_spread,
                  "kv_blocks_needed": plan.kv_blocks_needed(backend.block_size)},
        "load": {"loadavg_before": load_before, "loadavg_after": loadavg(), "sweep_wall_s": round(wall, 3),
                 "process_cpu_s": round(cpu, 3), "cpu_per_wall": round(cpu / wall, 3) if wall > 0 else None},
        "spread": spread_summary(points),
        "noise": noise,
        "fit_error": {group: fit_errors(fit.model, fitted) for group, (fitted, _) in split.items()},
        "holdout_error": {group: fit_errors(fit.model, held) for group, (_, held) in split.items() if held},
        "terms": {term: {"value": value, "standard_error": error} for term, (value, error) in fit.terms.items()},
        "notes": ["fit_error: on the fitted points (medians); holdout_error: on the held-out points, which the fit "
                  "never saw",
                  "terms: the scalar coefficients in seconds per step, request, KV token read and query-key pair, "
                  "with standard errors from the weighted least squares (0: clipped at zero)",
                  f"runtime {LEGACY_RUNTIME}: servegym's torch backend launches every kernel from Python each step "
                  "(no CUDA graphs); its terms are measured here, not built from the runtime registry",
                  "load: 1/5/15-minute load averages before and after the sweep, and the process's CPU seconds "
                  "per wall second during it (near the thread count when the process had its cores)",
                  "noise: the repeats' step-to-step jitter, the latency model's noise_cv (episodes on this profile "
                  "draw each step's time around the fit, seeded by the env)"],
    }
    provenance["notes"].append(f"cold_start_s is the measured checkpoint load time, {load_seconds:.2f} s"
                               if load_seconds is not None else
                               "cold_start_s is 0: the weights were built (randomly initialised), not loaded")
    warning = spread_warning(points)
    if warning:
        provenance["notes"].append(f"warning: {warning}")
    if build_seconds is not None:
        provenance["build_s"] = round(build_seconds, 3)
    profile = Profile(name, model, backend.num_kv_blocks, backend.block_size, float(load_seconds or 0.0),
                      provenance, runtime=LEGACY_RUNTIME)
    return profile, samples


def write_samples_csv(samples: dict[str, list[Sample]], path: str | Path) -> None:
    """Every timed step of the sweep, repeats included (one row each)."""
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["group", "point", *asdict(Sample(0, 0.0, 0, 0, 0.0))])
        for group, group_samples in samples.items():
            for s in group_samples:
                writer.writerow([group, point_label(group, s), *asdict(s).values()])


def plot_fit(profile: Profile, samples: dict[str, list[Sample]], path: str | Path) -> None:
    """Measured vs fitted: decode by batch, prefill by chunk, and every sweep point's median against its
    prediction with the held-out points marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    decode = samples["decode"]
    contexts = sorted({round(s.context / max(s.decode, 1)) for s in decode})
    for ctx in contexts:
        group = [s for s in decode if round(s.context / max(s.decode, 1)) == ctx]
        b = np.array([s.decode for s in group])
        left.scatter(b, [s.seconds * 1e3 for s in group], s=12, label=f"measured, context {ctx - 1}")
        grid = np.unique(b)
        fitted = [predict(profile.latency, Sample(int(x), float(x * ctx), 0, 0, 0.0)) * 1e3 for x in grid]
        left.plot(grid, fitted, lw=1)
    left.set(xlabel="decode batch size", ylabel="step latency (ms)", title="decode: measured vs fitted")
    left.legend(fontsize=7)
    for start in sorted({s.chunk_start for s in samples["prefill"]}):
        group = [s for s in samples["prefill"] if s.chunk_start == start]
        middle.scatter([s.chunk for s in group], [s.seconds * 1e3 for s in group], s=12,
                       label=f"measured, start {start}")
        grid = sorted({s.chunk for s in group})
        middle.plot(grid, [predict(profile.latency, Sample(0, 0.0, c, start, 0.0)) * 1e3 for c in grid], lw=1)
    middle.set(xlabel="prefill chunk tokens", ylabel="step latency (ms)", title="prefill: measured vs fitted")
    middle.legend(fontsize=7)
    top = 0.0
    for group, group_samples in samples.items():
        for part, points, marker in zip(("fitted", "held out"), split_holdout(group_samples), "ox", strict=True):
            measured = np.array([s.seconds * 1e3 for s in points])
            fitted = np.array([predict(profile.latency, s) * 1e3 for s in points])
            if measured.size:
                right.scatter(measured, fitted, s=14, marker=marker, label=f"{group}, {part}")
                top = max(top, measured.max(), fitted.max())
    right.plot([0, top], [0, top], c="grey", lw=0.8, ls="--")
    right.set(xlabel="measured median (ms)", ylabel="fitted (ms)", title="every sweep point", xscale="log",
              yscale="log")
    right.legend(fontsize=7)
    fig.suptitle(f"{profile.name}: {profile.provenance['hardware']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
