"""Calibration: sweep a real backend, fit the calibrated latency model, write a profile with provenance.

The fit is least squares on relative error: for every candidate breakpoint ``B0`` (each measured batch
size) the decode samples are regressed on ``[1, max(0, B - B0), context tokens]`` and the ``B0`` with the
smallest squared error wins; prefill samples, minus ``l_min``, are then regressed on ``[chunk tokens,
attention work]``. Repeats are reduced to their median before fitting; their spread, ``(max - min) /
median`` per sweep point, is recorded in the profile, and a high spread is reported (the fit then follows
noise: oversubscribed threads or a busy machine). The provenance also records the machine: device and its
name, dtype, threads, library versions, CPU count and the load during the sweep.
"""

from __future__ import annotations

import csv
import datetime
import inspect
import itertools
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.backends.base import StepBatch
from servegym.backends.calibrated import step_latency
from servegym.backends.profile import LatencyModel, Profile
from servegym.backends.token_model import prefill_attention_work

if TYPE_CHECKING:
    from servegym.backends.torch_backend import TorchBackend

CPU_MAX_BATCH, CPU_MAX_CONTEXT = 64, 512
"""The CPU sweep's default reach: about a minute of small-llama on 2 cores."""
CUDA_MAX_BATCH, CUDA_MAX_CONTEXT = 256, 2048
"""The GPU sweep's default reach. 256 requests of 2,048 tokens hold about 60 GB of KV for Llama-3.2-3B in
16 bits, which fits an 80 GB H100 beside the 6.4 GB of weights; 4,096 tokens would need 120 GB."""
SPREAD_WARNING = 0.2
"""Median relative spread of the sweep points above which calibrate warns that the fit may follow noise."""
HOST_INCLUSIVE, FORWARD_ONLY = "host-inclusive", "forward-only"
CLOCKS = (HOST_INCLUSIVE, FORWARD_ONLY)
"""What a real backend's step time counts: packing, forward pass and sampling, or the forward pass alone."""


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


# ---------------------------------------------------------------------------------------------- the sweep
WARMUP_CHUNK = 64
"""Prompt tokens of the untimed warm-up prefills that precede every sweep."""
UNTIMED_ROWS, UNTIMED_TOKENS = 16, 512
"""The untimed prefills that fill the cache before a timed step run at most this many requests of at most this
many tokens per step."""


def _ladder(first: int, factor: int, top: int) -> tuple[int, ...]:
    """``first, first * factor, ...`` while below ``top``, then ``top`` itself."""
    steps, value = [], first
    while value < top:
        steps.append(value)
        value *= factor
    return (*steps, top)


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass(frozen=True)
class SweepPlan:
    """What a calibration times, each point ``repeats`` times: decode-only steps of every batch size at every
    per-request context, single prefill chunks at every start offset, and mixed steps (decode batch, prefill
    chunk) whose decodes hold ``mixed_context`` tokens each. The defaults are the CPU sweep
    (``SweepPlan.up_to(64, 512)``)."""

    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    contexts: tuple[int, ...] = (32, 128, 512)
    chunks: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    chunk_starts: tuple[int, ...] = (0, 256)
    mixed: tuple[tuple[int, int], ...] = ((8, 64), (8, 256), (32, 64), (32, 256))
    mixed_context: int = 128
    repeats: int = 3

    def __post_init__(self) -> None:
        for name in ("batches", "contexts", "chunks"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"SweepPlan.{name} must be a non-empty tuple of values >= 1, got {values}")
        if not self.chunk_starts or min(self.chunk_starts) < 0:
            raise ValueError(f"SweepPlan.chunk_starts must be non-empty and >= 0, got {self.chunk_starts}")
        if any(min(pair) < 1 for pair in self.mixed):
            raise ValueError(f"SweepPlan.mixed pairs (decode batch, chunk) must be >= 1, got {self.mixed}")
        if self.mixed_context < 1 or self.repeats < 1:
            raise ValueError(f"SweepPlan.mixed_context and repeats must be >= 1, got {self.mixed_context} and "
                             f"{self.repeats}")

    @classmethod
    def up_to(cls, max_batch: int, max_context: int, repeats: int = 3) -> SweepPlan:
        """Batches 1, 2, 4, ... up to ``max_batch``; contexts 32, 128, 512, ... up to ``max_context``; chunks
        16, 32, ... up to ``max_context`` at starts 0 and ``max_context / 2``; mixed steps of ``max_batch / 8``
        and ``max_batch / 2`` decodes with chunks of 64 and 256 tokens (each capped at ``max_context``)."""
        if max_batch < 1 or max_context < 1:
            raise ValueError(f"max_batch and max_context must be >= 1, got {max_batch} and {max_context}")
        mixed_batches = sorted({max(1, max_batch // 8), max(1, max_batch // 2)})
        mixed_chunks = sorted({min(64, max_context), min(256, max_context)})
        return cls(batches=_ladder(1, 2, max_batch), contexts=_ladder(32, 4, max_context),
                   chunks=_ladder(16, 2, max_context), chunk_starts=tuple(sorted({0, max_context // 2})),
                   mixed=tuple(itertools.product(mixed_batches, mixed_chunks)),
                   mixed_context=min(128, max_context), repeats=repeats)

    def kv_blocks_needed(self, block_size: int) -> int:
        """KV blocks the sweep holds at its peak: the decode phase keeps ``max(batches)`` requests of the
        longest context, the first of which grows by one token per timed decode step."""
        decode = max(self.batches) * _blocks(max(self.contexts) + 1 + len(self.batches) * self.repeats, block_size)
        prefill = _blocks(max(self.chunk_starts) + max(self.chunks) + 1, block_size)
        mixed = max((batch * _blocks(self.mixed_context + 1 + self.repeats, block_size) + _blocks(chunk + 1,
                     block_size) for batch, chunk in self.mixed), default=0)
        return max(decode, prefill, mixed, _blocks(WARMUP_CHUNK + 1, block_size))

    def max_step_tokens(self) -> int:
        """Tokens of the sweep's largest step, timed or not (what a CUDA backend must profile memory for)."""
        rows = max(*self.batches, *(batch for batch, _ in self.mixed))
        tokens = max(*self.contexts, *self.chunk_starts, *((self.mixed_context,) if self.mixed else ()))
        untimed = min(UNTIMED_ROWS, rows) * min(UNTIMED_TOKENS, tokens)
        return max(untimed, *self.chunks, *(batch + chunk for batch, chunk in self.mixed), WARMUP_CHUNK)

    def check_fits(self, num_kv_blocks: int, block_size: int) -> None:
        """Raise a clear error when the sweep would overflow a cache of ``num_kv_blocks``."""
        need = self.kv_blocks_needed(block_size)
        if need > num_kv_blocks:
            raise ValueError(f"the sweep needs {need} KV blocks of {block_size} tokens ({max(self.batches)} requests "
                             f"of up to {max(self.contexts)} tokens) but the cache has {num_kv_blocks}: lower "
                             "--max-batch or --max-context, or raise --kv-blocks (or free device memory)")


class Sweeper:
    """Drives a backend with hand-made batches (no engine) and times them."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._next_id = 0

    def _new_ids(self, n: int) -> np.ndarray:
        ids = np.arange(self._next_id, self._next_id + n)
        self._next_id += n
        return ids

    def _prefill(self, ids: np.ndarray, tokens: int, target: int | None = None) -> None:
        """Ingest ``tokens`` prompt tokens of requests ``ids`` (whose prompts are ``target`` long) untimed, at most
        UNTIMED_ROWS requests of UNTIMED_TOKENS tokens per step."""
        empty = np.zeros(0, dtype=np.int64)
        for part in np.array_split(ids, -(-ids.size // UNTIMED_ROWS)):
            done = 0
            while done < tokens:
                step = min(UNTIMED_TOKENS, tokens - done)
                self.backend.execute(StepBatch(empty, empty, part, np.full(part.size, done),
                                               np.full(part.size, step), np.full(part.size, target or tokens)))
                done += step

    def decode(self, plan: SweepPlan, progress: Callable[[str], object] | None = None) -> list[Sample]:
        samples, empty = [], np.zeros(0, dtype=np.int64)
        for context in plan.contexts:
            ids = self._new_ids(max(plan.batches))
            self._prefill(ids, context)
            for batch in plan.batches:
                chosen = ids[:batch]
                for _ in range(plan.repeats):
                    seconds = self.backend.execute(StepBatch(chosen, empty, empty, empty, empty, empty))
                    samples.append(Sample(batch, float(batch * (context + 1)), 0, 0, seconds))
                if progress:
                    progress(f"decode B={batch} context={context}")
            self.backend.release(ids)
        return samples

    def prefill(self, plan: SweepPlan, progress: Callable[[str], object] | None = None) -> list[Sample]:
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

    def mixed(self, plan: SweepPlan) -> list[Sample]:
        samples, empty, context = [], np.zeros(0, dtype=np.int64), plan.mixed_context
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


# ---------------------------------------------------------------------------------------------- spread
@dataclass(frozen=True)
class PointSpread:
    """One sweep point's repeats: their median and relative spread ``(max - min) / median``."""

    label: str
    median_s: float
    relative_spread: float | None
    """None with a single repeat (nothing to compare)."""
    repeats: int


def _label(group: str, s: Sample) -> str:
    if group == "decode":
        return f"decode B={s.decode} context={round(s.context / s.decode) - 1}"
    if group == "prefill":
        return f"prefill chunk={s.chunk} start={s.chunk_start}"
    return f"{group} B={s.decode} chunk={s.chunk}"


def point_spreads(samples: dict[str, list[Sample]]) -> list[PointSpread]:
    """Every sweep point of every group (``decode``, ``prefill``, ``mixed``), in sweep order."""
    times: dict[str, list[float]] = {}
    for group, group_samples in samples.items():
        for s in group_samples:
            times.setdefault(_label(group, s), []).append(s.seconds)
    points = []
    for label, seconds in times.items():
        median = float(np.median(seconds))
        spread = (max(seconds) - min(seconds)) / median if len(seconds) > 1 and median > 0 else None
        points.append(PointSpread(label, median, spread, len(seconds)))
    return points


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


# ---------------------------------------------------------------------------------------------- provenance
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


def device_name(device: str) -> str:
    """The name of the CUDA device ``device`` (by its own index), or the CPU model."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return cpu_model()


def backend_clock(backend: object) -> str:
    """The clock a real backend's ``execute`` reports. Backends without the ``count_host_time`` option time
    the forward pass only."""
    return HOST_INCLUSIVE if getattr(backend, "count_host_time", False) else FORWARD_ONLY


def clock_option(clock: str | None, strict: bool = True) -> dict[str, bool]:
    """TorchBackend keyword arguments that select ``clock`` (none for None: the backend's default). A backend
    without ``count_host_time`` times the forward pass only; asking it for host time is an error when
    ``strict``, and otherwise leaves the backend as it is."""
    if clock is None:
        return {}
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {list(CLOCKS)}, got {clock!r}")
    if backend_accepts("count_host_time"):
        return {"count_host_time": clock == HOST_INCLUSIVE}
    if clock == HOST_INCLUSIVE and strict:
        raise ValueError("this TorchBackend times the forward pass only (it has no count_host_time option); "
                         f"use --clock {FORWARD_ONLY}")
    return {}


def backend_accepts(option: str) -> bool:
    """Whether TorchBackend takes ``option`` (options other work adds: this module works with and without)."""
    from servegym.backends.torch_backend import TorchBackend

    return option in inspect.signature(TorchBackend).parameters


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine(backend: TorchBackend) -> dict[str, Any]:
    """What the machine was: device and its name, dtype, threads, CPUs and library versions."""
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"device": str(backend.device), "device_name": device_name(str(backend.device)),
            "dtype": str(backend.dtype), "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "cpus_usable": cpus, "clock": backend_clock(backend), "attention": getattr(backend, "attention", None),
            "versions": {**backend.versions, "python": platform.python_version(), "numpy": np.__version__}}


# ---------------------------------------------------------------------------------------------- calibrate
def calibrate(backend: TorchBackend, name: str, plan: SweepPlan | None = None, load_seconds: float | None = None,
              progress: Callable[[str], object] | None = None,
              build_seconds: float | None = None) -> tuple[Profile, dict[str, list[Sample]]]:
    """Sweep ``backend``, fit the latency model and build a profile with provenance and fit errors.

    ``load_seconds`` is the measured load of a checkpoint (the profile's cold start; None: 0, as for a preset
    whose weights are randomly initialised); ``build_seconds`` the time the backend took to build, recorded."""
    plan = plan or SweepPlan()
    plan.check_fits(backend.num_kv_blocks, backend.block_size)
    sweeper = Sweeper(backend)
    load_before, wall, cpu = _loadavg(), time.perf_counter(), time.process_time()
    sweeper.prefill(SweepPlan(chunks=(WARMUP_CHUNK,), chunk_starts=(0,), repeats=2))  # warm-up, discarded
    samples = {"decode": sweeper.decode(plan, progress), "prefill": sweeper.prefill(plan, progress),
               "mixed": sweeper.mixed(plan)}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    model = fit_latency_model(samples["decode"], samples["prefill"])
    points = point_spreads(samples)
    host = machine(backend)
    hardware = host["device_name"] if host["device"].startswith("cuda") else \
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
        "load": {"loadavg_before": load_before, "loadavg_after": _loadavg(), "sweep_wall_s": round(wall, 3),
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
    if spread_warning(points):
        provenance["notes"].append(f"warning: {spread_warning(points)}")
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
                writer.writerow([group, _label(group, s), *asdict(s).values()])


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
