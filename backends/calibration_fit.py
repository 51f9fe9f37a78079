"""The fit of a calibration: timed steps in, the calibrated :class:`LatencyModel` out.

Least squares on relative error: for every candidate breakpoint ``B0`` (each measured batch size) the decode
samples are regressed on ``[1, max(0, B - B0), context tokens]`` and the ``B0`` with the smallest squared error
wins; prefill samples, minus ``l_min``, are then regressed on ``[chunk tokens, attention work]``. Repeats are
reduced to their median before fitting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.backends.base import prefill_attention_work
from servegym.backends.calibrated import step_latency
from servegym.backends.profile import LatencyModel


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
