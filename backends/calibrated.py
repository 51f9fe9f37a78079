"""The calibrated backend: step latency from a fitted piecewise-linear model, no model execution."""

from __future__ import annotations

import math

import numpy as np

from servegym.backends.base import StepBatch
from servegym.backends.profile import LatencyModel, Profile


def step_latency(
    model: LatencyModel,
    decode_batch: int,
    prefill_tokens: float = 0.0,
    prefill_attention: float = 0.0,
    decode_context: float = 0.0,
) -> float:
    """Noise-free latency of one iteration.

    ``l(B) = l_min + alpha * max(0, B - B0)`` for ``B`` decoding requests, plus
    ``prefill_s_per_token * prefill_tokens``, plus ``prefill_s_per_token_context * prefill_attention``
    (the sum over chunk tokens of the context each attends to), plus
    ``decode_s_per_context_token * decode_context`` (KV tokens read by the decodes).
    """
    excess = decode_batch - model.saturation_batch
    latency = model.l_min_s + (model.alpha_s * excess if excess > 0 else 0.0)
    return (
        latency
        + model.prefill_s_per_token * prefill_tokens
        + model.prefill_s_per_token_context * prefill_attention
        + model.decode_s_per_context_token * decode_context
    )


def prefill_attention_work(start: np.ndarray, length: np.ndarray) -> float:
    """Sum over chunk tokens of their attention context: token j of a chunk sees ``start + j + 1`` tokens."""
    return float(np.dot(length, start + (length + 1) * 0.5))


class CalibratedBackend:
    """Times iterations with a :class:`LatencyModel`; optional seeded multiplicative log-normal noise."""

    def __init__(self, profile: Profile, noise_cv: float | None = None) -> None:
        self.profile = profile
        self.model = profile.latency
        self.num_kv_blocks = profile.num_kv_blocks
        self.block_size = profile.block_size
        self.baseline_step_s: float | None = profile.latency.l_min_s
        self.owns_cache = False  # time only: the engine may size the cache as it likes
        cv = self.model.noise_cv if noise_cv is None else noise_cv
        if not (math.isfinite(cv) and cv >= 0):
            raise ValueError(f"noise_cv must be a finite number >= 0, got {cv!r}")
        # A log-normal factor with mean 1 and the requested coefficient of variation.
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._rng: np.random.Generator | None = None

    def reset(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def execute(self, batch: StepBatch) -> float:
        model = self.model
        prefill_tokens = prefill_attention = decode_context = 0.0
        if batch.prefill_len.size:
            prefill_tokens = float(batch.prefill_len.sum())
            if model.prefill_s_per_token_context:
                prefill_attention = prefill_attention_work(batch.prefill_start, batch.prefill_len)
        if model.decode_s_per_context_token and batch.decode_context.size:
            decode_context = float(batch.decode_context.sum())
        latency = step_latency(model, batch.decode_ids.size, prefill_tokens, prefill_attention, decode_context)
        if self._sigma:
            if self._rng is None:
                raise RuntimeError("CalibratedBackend.execute called before reset(rng)")
            latency *= math.exp(self._sigma * self._rng.standard_normal() - 0.5 * self._sigma**2)
        return latency

    def release(self, request_ids: np.ndarray) -> None:
        """Nothing to free: the calibrated backend holds no tensors."""
