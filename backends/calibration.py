"""Calibration: sweep a real backend, fit the calibrated latency model, write a profile with provenance.

The parts live beside this module: the sweep (:mod:`~servegym.backends.calibration_sweep`), the fit
(:mod:`~servegym.backends.calibration_fit`), and the clock, machine and repeat spread the profile records beside
the fit (:mod:`~servegym.backends.calibration_provenance`). This module adds the machine's load during the sweep.
"""

from __future__ import annotations

import csv
import datetime
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servegym.backends.calibration_fit import Sample, fit_errors, fit_latency_model, predict
from servegym.backends.calibration_provenance import loadavg, machine, point_spreads, spread_summary, spread_warning
from servegym.backends.calibration_sweep import WARMUP_CHUNK, Sweeper, SweepPlan, point_label
from servegym.backends.profile import Profile

if TYPE_CHECKING:
    from servegym.backends.torch_backend import TorchBackend


def calibrate(backend: TorchBackend, name: str, plan: SweepPlan | None = None, load_seconds: float | None = None,
              progress: Callable[[str], object] | None = None,
              build_seconds: float | None = None) -> tuple[Profile, dict[str, list[Sample]]]:
    """Sweep ``backend``, fit the latency model and build a profile with provenance and fit errors.

    ``load_seconds`` is the measured load of a checkpoint (the profile's cold start; None: 0, as for a preset
    whose weights are randomly initialised); ``build_seconds`` the time the backend took to build, recorded."""
    plan = plan or SweepPlan()
    plan.check_fits(backend.num_kv_blocks, backend.block_size)
    sweeper = Sweeper(backend)
    load_before, wall, cpu = loadavg(), time.perf_counter(), time.process_time()
    sweeper.prefill(SweepPlan(chunks=(WARMUP_CHUNK,), chunk_starts=(0,), repeats=2))  # warm-up, discarded
    samples = {"decode": sweeper.decode(plan, progress), "prefill": sweeper.prefill(plan, progress),
               "mixed": sweeper.mixed(plan)}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    model = fit_latency_model(samples["decode"], samples["prefill"])
    points = point_spreads(samples)
    host = machine(backend)
    hardware = host["device_name"] if backend.is_cuda else \
        f"CPU: {host['device_name']}, {host['threads']} thread{'s' * (host['threads'] != 1)}"
    provenance = {
        "hardware": hardware,
        "model": f"{backend.model_name} ({backend.dtype})",
        "method": (f"servegym calibrate: decode batches {list(plan.batches)} at contexts {list(plan.contexts)}, "
                   f"prefill chunks {list(plan.chunks)} at starts {list(plan.chunk_starts)}, mixed steps "
                   f"{[list(m) for m in plan.mixed]}, {plan.repeats} repeats each (median), timed on the "
                   f"{host['clock']} clock; piecewise-linear least squares with the breakpoint chosen by least "
                   "squares"),
        "date": datetime.date.today().isoformat(),
        **host,
        "sweep": {"max_batch": max(plan.batches), "max_context": max(plan.contexts), "repeats": plan.repeats,
                  "kv_blocks_needed": plan.kv_blocks_needed(backend.block_size)},
        "load": {"loadavg_before": load_before, "loadavg_after": loadavg(), "sweep_wall_s": round(wall, 3),
                 "process_cpu_s": round(cpu, 3), "cpu_per_wall": round(cpu / wall, 3) if wall > 0 else None},
        "spread": spread_summary(points),
        "fit_error": {group: fit_errors(model, group_samples) for group, group_samples in samples.items()},
        "notes": ["mixed steps are not fitted; their error checks that decode and prefill costs add up",
                  "load: 1/5/15-minute load averages before and after the sweep, and the process's CPU seconds "
                  "per wall second during it (near the thread count when the process had its cores)"],
    }
    provenance["notes"].append(f"cold_start_s is the measured checkpoint load time, {load_seconds:.2f} s"
                               if load_seconds is not None else
                               "cold_start_s is 0: the weights were built (randomly initialised), not loaded")
    warning = spread_warning(points)
    if warning:
        provenance["notes"].append(f"warning: {warning}")
    if build_seconds is not None:
        provenance["build_s"] = round(build_seconds, 3)
    profile = Profile(name, model, backend.num_kv_blocks, backend.block_size, float(load_seconds or 0.0), provenance)
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
