"""What a calibration records beside the fit: the clock a step's time counts, the machine it ran on, and how
far each sweep point's repeats disagree.

The spread of a point is ``(max - min) / median`` of its repeats; a high median spread is reported, as the fit
then follows noise (oversubscribed threads or a busy machine). The machine is the device and its name, dtype,
threads, library versions and CPU count.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.backends.calibration_fit import Sample
from servegym.backends.calibration_sweep import point_label
from servegym.backends.profile_limits import MAX_NOISE_CV

if TYPE_CHECKING:
    import torch

    from servegym.backends.torch_backend import TorchBackend

SPREAD_WARNING = 0.2
"""Median relative spread of the sweep points above which calibrate warns that the fit may follow noise."""
HOST_INCLUSIVE, FORWARD_ONLY = "host-inclusive", "forward-only"
CLOCKS = (HOST_INCLUSIVE, FORWARD_ONLY)
"""What a real backend's step time counts: packing, forward pass and sampling, or the forward pass alone."""


# ---------------------------------------------------------------------------------------------- clocks
def backend_clock(backend: TorchBackend) -> str:
    """The clock a real backend's ``execute`` reports."""
    return HOST_INCLUSIVE if backend.count_host_time else FORWARD_ONLY


def clock_option(clock: str | None) -> dict[str, bool]:
    """TorchBackend keyword arguments that select ``clock`` (none for None: the backend's default)."""
    if clock is None:
        return {}
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {list(CLOCKS)}, got {clock!r}")
    return {"count_host_time": clock == HOST_INCLUSIVE}


# ---------------------------------------------------------------------------------------------- machine
def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else what ``platform`` knows."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device) -> str:
    """The name of the CUDA device ``device`` (by its own index), or the CPU model."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_model()


def loadavg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the OS does not tell)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine(backend: TorchBackend) -> dict[str, Any]:
    """What the machine was: device and its name, dtype, threads, CPUs and library versions."""
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"device": backend.device, "device_name": device_name(backend.torch_device),
            "dtype": backend.dtype, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "cpus_usable": cpus, "clock": backend_clock(backend), "attention": backend.attention,
            "versions": {**backend.versions, "python": platform.python_version(), "numpy": np.__version__}}


# ---------------------------------------------------------------------------------------------- spread
@dataclass(frozen=True)
class PointSpread:
    """One sweep point's repeats: their median and relative spread ``(max - min) / median``."""

    label: str
    median_s: float
    relative_spread: float | None
    """None with a single repeat (nothing to compare)."""
    repeats: int


def point_spreads(samples: dict[str, list[Sample]]) -> list[PointSpread]:
    """Every sweep point of every group (``decode``, ``prefill``, ``mixed``), in sweep order."""
    times: dict[str, list[float]] = {}
    for group, group_samples in samples.items():
        for s in group_samples:
            times.setdefault(point_label(group, s), []).append(s.seconds)
    points = []
    for label, seconds in times.items():
        median = float(np.median(seconds))
        spread = (max(seconds) - min(seconds)) / median if len(seconds) > 1 and median > 0 else None
        points.append(PointSpread(label, median, spread, len(seconds)))
    return points


def repeat_noise(samples: dict[str, list[Sample]]) -> dict[str, Any]:
    """The step-to-step jitter of the repeats, as the calibrated model's log-normal noise.

    Each point's repeats are the same step timed again; the log of a time less the mean log of its point is
    the jitter. Pooled over every point with two or more repeats, ``sigma^2 = sum (l - mean_l)^2 / sum (n - 1)``
    (unbiased), and the noise is the log-normal's coefficient of variation, ``sqrt(exp(sigma^2) - 1)``, which
    :class:`~servegym.backends.calibrated.CalibratedBackend` draws with mean 1. With one repeat a point there is
    nothing to pool: ``cv`` is 0. A cv over the profile's limit (``MAX_NOISE_CV``) is kept as ``measured_cv`` and
    the model takes the limit, so a sweep on a busy machine still gives a profile that says so."""
    times: dict[str, list[float]] = {}
    for group, group_samples in samples.items():
        for s in group_samples:
            times.setdefault(point_label(group, s), []).append(s.seconds)
    squares, dof, points = 0.0, 0, 0
    for seconds in times.values():
        if len(seconds) > 1 and min(seconds) > 0:
            logs = np.log(seconds)
            squares += float(((logs - logs.mean()) ** 2).sum())
            dof += len(seconds) - 1
            points += 1
    sigma = math.sqrt(squares / dof) if dof else 0.0
    cv = math.sqrt(math.expm1(sigma * sigma))
    noise = {"cv": min(cv, MAX_NOISE_CV), "sigma_log": sigma, "points": points, "degrees_of_freedom": dof,
             "method": "pooled variance of log(time) about each point's mean log over its repeats; cv of the "
                       "log-normal with that sigma (mean 1)"}
    if cv > MAX_NOISE_CV:  # jitter a profile cannot hold (a busy machine): the most it allows, the measure kept
        noise.update(measured_cv=cv, capped=f"measured cv {cv:.3g} is over the {MAX_NOISE_CV:g} a profile allows "
                                            "(typically a busy machine): the model keeps that limit; calibrate "
                                            "again on a quiet machine for the real jitter")
    return noise


def spread_summary(points: list[PointSpread], threshold: float = SPREAD_WARNING) -> dict[str, Any]:
    """The provenance entry: median and largest relative spread, and the points above ``threshold``."""
    measured = [p for p in points if p.relative_spread is not None]
    if not measured:
        return {"measure": "not measured: one repeat per point", "points": len(points)}
    spreads = [p.relative_spread for p in measured]
    return {"measure": "(max - min) / median of each point's repeats", "points": len(points),
            "median": float(np.median(spreads)), "max": float(max(spreads)), "threshold": threshold,
            "above_threshold": {p.label: round(p.relative_spread, 4) for p in measured
                                if p.relative_spread > threshold}}


def spread_warning(points: list[PointSpread], threshold: float = SPREAD_WARNING) -> str | None:
    """A warning naming the noisiest points when the median point's relative spread exceeds ``threshold``."""
    measured = [p for p in points if p.relative_spread is not None]
    if not measured:
        return None
    median = float(np.median([p.relative_spread for p in measured]))
    if median <= threshold:
        return None
    noisy = sorted((p for p in measured if p.relative_spread > threshold), key=lambda p: -p.relative_spread)
    listed = ", ".join(f"{p.label} {p.relative_spread:.0%}" for p in noisy[:8])
    more = f" and {len(noisy) - 8} more" if len(noisy) > 8 else ""
    return (f"the repeats disagree: the median point's (max - min) / median is {median:.0%}, above "
            f"{threshold:.0%}; noisiest: {listed}{more}. The fit may follow noise: rerun with --threads 1 on a "
            "quieter machine")
