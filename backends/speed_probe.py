"""How fast a real backend runs now against the profile fitted on it: a few of the calibration sweep's steps,
timed and priced by the profile.

A profile is fitted once, on one machine at one time. A shared machine's speed drifts (this project's 2-core VM by
10-30% within half an hour), and a fidelity check run later carries that drift into every metric. The probe
separates the two: it times a small fixed set of steps (decode batches, single prefill chunks, mixed steps; the
cache's free blocks shuffled first, as the calibration sweep does) and reports the median of measured / predicted,
for decode-only steps and for steps with prefill apart. 1.0 means the machine runs as it did when the profile was
fitted; 1.1 means 10% slower.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.backends.base import Backend
from servegym.backends.calibration_fit import predict
from servegym.backends.calibration_sweep import (
    CPU_MAX_BATCH,
    CPU_MAX_CONTEXT,
    SCATTER_ROWS,
    WARMUP_CHUNK,
    Sweeper,
    SweepPlan,
)
from servegym.backends.profile import Profile


def probe_plan(profile: Profile) -> SweepPlan:
    """The probe's steps, inside the reach of the sweep the profile was fitted on (``provenance["sweep"]``; the CPU
    sweep's defaults where it records none): decode batches 1, 4 and 16 at context 128, single prefill chunks of 64
    and 256 tokens and mixed steps of 4 decodes and a 64-token chunk, each capped by that reach (so the probe is
    priced where the profile was measured, not extrapolated), 3 repeats: 18 timed steps. The decode rows' contexts
    spread as the sweep's did (``context_spread``; none where the profile records none)."""
    reach = profile.provenance.get("sweep") or {}
    batch = min(16, int(reach.get("max_batch", CPU_MAX_BATCH)))
    context = min(128, int(reach.get("max_context", CPU_MAX_CONTEXT)))
    tokens = int(reach.get("max_tokens", context))
    return SweepPlan(batches=tuple(sorted({1, max(1, batch // 4), batch})), contexts=(context,),
                     chunks=tuple(sorted({min(64, tokens), min(256, tokens)})), chunk_starts=(0,),
                     mixed=((max(1, batch // 4), min(64, tokens)),), mixed_context=context, repeats=3, batched=(),
                     context_spread=float(reach.get("context_spread", 0.0)))


def describe_plan(plan: SweepPlan) -> str:
    """The probe's steps in words (what a report says it timed)."""
    spread = f" (rows spread by +-{plan.context_spread:g} of it)" if plan.context_spread else ""
    mixed = ", ".join(f"{b} decodes and a {c}-token chunk" for b, c in plan.mixed)
    return (f"decode batches {', '.join(map(str, plan.batches))} at context {', '.join(map(str, plan.contexts))}"
            f"{spread}, prefill chunks of {', '.join(map(str, plan.chunks))} tokens, mixed steps of {mixed}")


@dataclass(frozen=True)
class MachineSpeed:
    """How long the machine's steps take now against the profile (measured / predicted, medians): 1.0 is the speed
    the profile was fitted at. A machine's drift need not be the same for every kind of step (on a CPU, compute-bound
    prefills and memory-bound decodes can move apart), so the two kinds are read apart."""

    decode: float
    """Over the decode-only steps."""
    prefill: float
    """Over the steps with a prefill chunk (single chunks and mixed steps)."""

    def __str__(self) -> str:
        return f"{self.decode:.3f}/{self.prefill:.3f}"


def machine_speed(backend: Backend, profile: Profile, rng: np.random.Generator | None = None) -> MachineSpeed:
    """The medians over the probe's timed steps (:func:`probe_plan`) of ``measured / predicted`` on ``backend``,
    decode-only steps and steps with prefill apart (reset first, so the probe starts from an empty cache; an
    episode resets it again)."""
    plan = probe_plan(profile)
    plan.check_fits(backend.num_kv_blocks, backend.block_size)
    rng = rng if rng is not None else np.random.default_rng(0)
    backend.reset(rng)
    sweeper = Sweeper(backend)
    sweeper.prefill(SweepPlan(chunks=(WARMUP_CHUNK,), chunk_starts=(0,), repeats=1))  # warm-up, discarded
    sweeper.scatter(min(backend.num_kv_blocks, plan.kv_blocks_needed(backend.block_size)), rng,
                    rows=min(plan.max_step_tokens(), SCATTER_ROWS))
    decode, prefill = sweeper.decode(plan), [*sweeper.prefill(plan), *sweeper.mixed(plan)]
    return MachineSpeed(*(float(np.median([s.seconds / predict(profile.latency, s) for s in kind]))
                          for kind in (decode, prefill)))


DRIFT_LIMIT = 0.05
"""How far a machine may run from its profile's speed (either kind's median) before the profile, read as calibrated,
is out of date. In the CPU fidelity runs of 2026-12-03, the runs whose probes centred within 5% scored 19 to 24 of 24
metrics within 10% as calibrated, and those 5-15% off 7 to 11 (docs/REAL_BACKEND.md)."""


KINDS = {"decode": "decode-only steps", "prefill": "steps with prefill"}
"""The two kinds of step the probe reads apart (:class:`MachineSpeed`'s fields), in words."""


def kind_medians(speeds: list[MachineSpeed]) -> dict[str, float]:
    """Each kind's median over several probes."""
    if not speeds:
        raise ValueError("the kinds' medians need at least one probe")
    return {kind: float(np.median([getattr(x, kind) for x in speeds])) for kind in KINDS}


def drift(median: float) -> str:
    """A kind's median (measured / profile) as how much slower or faster the machine runs, e.g. ``6.0% faster``."""
    return f"{abs(median - 1):.1%} {'slower' if median > 1 else 'faster'}"


def drift_advice(speeds: list[MachineSpeed], limit: float = DRIFT_LIMIT) -> str:
    """What the probes' medians (per kind) say of the profile: no drift the probe can see, or recalibrate. A
    non-finite median counts as drift."""
    far = {kind: m for kind, m in kind_medians(speeds).items() if not abs(m - 1.0) <= limit}
    if not far:
        return (f"within {limit:.0%} of the profile's speed on both kinds of step: no drift the probe can see, read "
                "the profile as calibrated")
    moved = " and ".join(f"{KINDS[k]} {drift(m)}" for k, m in far.items())
    return (f"{moved} than when the profile was fitted, beyond {limit:.0%}: recalibrate (servegym calibrate), or read "
            "fidelity's results at the measured machine speed")
