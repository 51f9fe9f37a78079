"""The calibrated backend: step latency from a fitted piecewise-linear model, no model execution."""

from __future__ import annotations

import math

import numpy as np

from servegym.backends.base import BatchTotals, StepBatch, batch_totals
from servegym.backends.host_link import host_link_bytes_s
from servegym.backends.profile import LatencyModel, Profile
from servegym.backends.profile_limits import check_noise


def step_latency(model: LatencyModel, decode_batch: int, prefill_tokens: float = 0.0,
                 prefill_attention: float = 0.0, decode_context: float = 0.0) -> float:
    """Noise-free latency of one iteration under a schema-1 model (see :meth:`LatencyModel.step_s`)."""
    return model.step_s(decode_batch, prefill_tokens, prefill_attention, decode_context)


class CalibratedBackend:
    """Times iterations with a :class:`LatencyModel`; optional seeded multiplicative log-normal noise."""

    def __init__(self, profile: Profile, noise_cv: float | None = None, time_scale: float = 1.0,
                 prefill_time_scale: float | None = None) -> None:
        """``time_scale`` multiplies every decode-only step's time (and the baseline step), ``prefill_time_scale``
        (default: ``time_scale``) every step's with a prefill chunk: the profile's machine running that much slower
        (``servegym.backends.speed_probe`` measures both)."""
        prefill_time_scale = time_scale if prefill_time_scale is None else prefill_time_scale
        for name, scale in (("time_scale", time_scale), ("prefill_time_scale", prefill_time_scale)):
            if not (math.isfinite(scale) and scale > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {scale!r}")
        self.profile = profile
        self.model = profile.latency
        self.time_scale, self.prefill_time_scale = float(time_scale), float(prefill_time_scale)
        self._scaled = (self.time_scale, self.prefill_time_scale) != (1.0, 1.0)
        self.num_kv_blocks = profile.num_kv_blocks
        self.block_size = profile.block_size
        self.baseline_step_s: float | None = profile.latency.l_min_s * self.time_scale
        self.owns_cache = False  # time only: the engine may size the cache as it likes
        self.kv_bytes_per_token: float | None = getattr(profile.latency, "kv_bytes_per_token", None)
        """Per GPU, for the host tier's copy time (schema-1 profiles do not state it)."""
        self.host_link_bytes_s = host_link_bytes_s(str(profile.provenance.get("hardware", "")))
        cv = self.model.noise_cv if noise_cv is None else noise_cv
        if not (math.isfinite(cv) and cv >= 0):
            raise ValueError(f"noise_cv must be a finite number >= 0, got {cv!r}")
        check_noise(cv)  # the profile's own was checked when it loaded; an override is checked here
        # A log-normal factor with mean 1 and the requested coefficient of variation.
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._rng: np.random.Generator | None = None

    def reset(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def execute(self, batch: StepBatch) -> float:
        return self.execute_totals(batch_totals(batch))

    def execute_totals(self, totals: BatchTotals) -> float:
        """:meth:`execute` from the batch's totals alone (the compiled engine builds no arrays)."""
        latency = self.model.totals_s(totals)
        if self._scaled:  # the per-step path: nothing to pick or multiply at the profile's own speed
            latency *= self.prefill_time_scale if totals.num_prefills else self.time_scale
        if self._sigma:
            if self._rng is None:
                raise RuntimeError("CalibratedBackend.execute called before reset(rng)")
            latency *= math.exp(self._sigma * self._rng.standard_normal() - 0.5 * self._sigma**2)
        return latency

    def release(self, request_ids: np.ndarray) -> None:
        """Nothing to free: the calibrated backend holds no tensors."""
