"""The fit of a calibration: timed steps in, a schema-2 :class:`TokenLatencyModel` out.

The same token-based model the GPU profiles use. A sampled iteration of ``rows`` requests and ``T`` tokens, whose
decodes read ``K`` KV tokens and whose chunk attends over ``P`` (query, key) pairs, costs

    cpu(rows) + linear(T) + K * kv_s + P * pair_s,    cpu(rows) = c0 + c1 * rows,

with ``linear`` monotone and piecewise linear, zero at one token (so ``c0`` holds the floor), with knots at the
sweep's decode-only and single-prefill token counts and at the largest step (a CPU's matrix kernels change
pace between one row and two, so the knots follow the sweep). On a CPU backend everything is host work:
``cpu`` is the per-iteration floor plus each request's share (packing, its attention call and its sampled row),
``linear`` the layers' work by tokens. All coefficients come from one least-squares fit on relative error (20 ms
and 1 s steps count alike), non-negative, over the median of each point's repeats; every fifth point of each
group is held out of the fit and its error reported.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from servegym.backends.base import BatchTotals, prefill_attention_work
from servegym.backends.profile import LatencyModel
from servegym.backends.token_model import TokenLatencyModel

HOLDOUT_EVERY = 5
"""Every fifth distinct point of each group (from the third on) is held out of the fit."""


@dataclass(frozen=True)
class Sample:
    """One timed iteration: ``decode`` requests holding ``context`` KV tokens in all, plus ``prompts`` prefill
    chunks of ``chunk`` tokens each from ``chunk_start`` (none when ``chunk`` is 0), each completing its
    prompt."""

    decode: int
    context: float
    chunk: int
    chunk_start: int
    seconds: float
    prompts: int = 1

    @property
    def num_prefills(self) -> int:
        return self.prompts if self.chunk else 0

    @property
    def attention(self) -> float:
        """(query, key) pairs of all the chunks."""
        if not self.chunk:
            return 0.0
        return self.prompts * prefill_attention_work(np.array([self.chunk_start]), np.array([self.chunk]))

    def totals(self) -> BatchTotals:
        n = self.num_prefills
        return BatchTotals(self.decode, self.context, n, float(n * self.chunk), self.attention, n)


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares on relative error (rows weighted by 1/y), with coefficients clipped at zero (dropping the
    most negative column and refitting until none is negative); returns the coefficients and their standard
    errors (0 for a dropped column)."""
    keep = np.ones(x.shape[1], dtype=bool)
    w = 1.0 / np.maximum(np.abs(y), 1e-9)
    while True:
        coef = np.zeros(x.shape[1])
        xw = x[:, keep] * w[:, None]
        coef[keep] = np.linalg.lstsq(xw, y * w, rcond=None)[0]
        if not (keep & (coef < 0)).any():
            break
        keep[int(np.argmin(np.where(keep, coef, np.inf)))] = False
    errors = np.zeros(x.shape[1])
    dof = x.shape[0] - int(keep.sum())
    if dof > 0:
        residual = xw @ coef[keep] - y * w
        errors[keep] = np.sqrt(np.clip(np.diag(np.linalg.pinv(xw.T @ xw)), 0.0, None) * (residual @ residual) / dof)
    return coef, errors


def medians(samples: list[Sample]) -> list[Sample]:
    """One sample per distinct configuration, at the median of its repeats (robust to timing outliers)."""
    groups: dict[tuple, list[float]] = {}
    for s in samples:
        groups.setdefault((s.decode, s.context, s.chunk, s.chunk_start, s.prompts), []).append(s.seconds)
    return [Sample(d, c, k, st, float(np.median(times)), n) for (d, c, k, st, n), times in groups.items()]


def split_holdout(samples: list[Sample]) -> tuple[list[Sample], list[Sample]]:
    """(fitted, held out) medians of one group: every :data:`HOLDOUT_EVERY`-th distinct point, from the third,
    is held out (a fixed rule, so a calibration is reproducible)."""
    points = medians(samples)
    held = {i for i in range(2, len(points), HOLDOUT_EVERY)}
    return [p for i, p in enumerate(points) if i not in held], [p for i, p in enumerate(points) if i in held]


def _shape(s: Sample) -> tuple[int, int]:
    """(rows, tokens) of a sample's iteration."""
    return s.decode + s.num_prefills, s.decode + s.num_prefills * s.chunk


def _knots(samples: list[Sample]) -> np.ndarray:
    """Token knots of ``linear``: 1, every decode-only and every single-prefill step's token count, and the
    largest step's. Where the two kinds share a token count (decode batch T, chunk of T tokens) they differ
    only in rows, which pins ``cpu``'s per-row slope; mixed steps fall between knots."""
    shapes = [(_shape(s), s.chunk == 0) for s in samples]
    pure = [tokens for (rows, tokens), decode_only in shapes if (decode_only or rows == 1) and tokens > 1]
    return np.unique([1.0, *pure, max(tokens for (_, tokens), _ in shapes)])


def _knee(samples: list[Sample]) -> float:
    """The long-context term's knee: the decode-only steps' second-longest context per row (0, and no term, with
    fewer than three distinct contexts). On the CPU backend a row's attention costs about the same per step up to
    there and more per token beyond; a linear KV term is too high below it and too low above."""
    contexts = sorted({s.context / s.decode for s in samples if s.decode and not s.num_prefills})
    return float(contexts[-2]) if len(contexts) >= 3 else 0.0


def _long_context(samples: list[Sample], knee: float) -> np.ndarray:
    """The long-context term's two columns: the decoding rows' mean context above ``knee``, per step and per row."""
    over = np.array([max(0.0, s.context / s.decode - knee) if s.decode and knee else 0.0 for s in samples])
    return np.column_stack([over, over * np.array([s.decode for s in samples], dtype=float)])


@dataclass(frozen=True)
class Fit:
    """A fitted model and its scalar terms' values with their standard errors (from the weighted least squares'
    covariance; 0 for a term clipped at zero)."""

    model: TokenLatencyModel
    terms: dict[str, tuple[float, float]]
    """``name -> (value, standard error)`` for ``cpu_s_per_step``, ``cpu_s_per_row``, ``cpu_s_mixed_step``,
    ``kv_s_per_token``, ``s_per_pair``, ``long_context_s_per_token`` and ``long_context_s_per_row_token``."""


def fit_token_model(samples: list[Sample], kv_bytes_per_token: float, flops_per_pair: float) -> Fit:
    """The schema-2 model of ``samples`` (medians, any groups); ``kv_bytes_per_token`` and ``flops_per_pair`` are
    the model's own (the fit gives the effective bandwidth and FLOP rate that turn them into seconds)."""
    if len(samples) < 4:
        raise ValueError(f"a fit needs at least 4 sweep points, got {len(samples)}")
    rows = np.array([_shape(s)[0] for s in samples], dtype=float)
    tokens = np.array([_shape(s)[1] for s in samples], dtype=float)
    knots = _knots(samples)
    ramps = np.column_stack([np.clip(tokens - lo, 0.0, hi - lo) for lo, hi in itertools.pairwise(knots)])
    mixed = [float(s.num_prefills > 0 and s.decode > 0) for s in samples]
    knee = _knee(samples)
    x = np.column_stack([np.ones_like(rows), rows, mixed, ramps,
                         [s.context for s in samples], [s.attention for s in samples], _long_context(samples, knee)])
    y = np.array([s.seconds for s in samples])
    coef, errors = _nonneg_lstsq(x, y)
    c0, c1, c_mixed, slopes, kv_s, pair_s = coef[0], coef[1], coef[2], coef[3:-4], coef[-4], coef[-3]
    long_step, long_row = coef[-2], coef[-1]
    linear = np.concatenate(([0.0], np.cumsum(slopes * np.diff(knots))))
    top = float(max(rows.max(), 2.0))
    # A term the fit found no cost for keeps its physical size over a rate so high it charges nothing visible.
    bandwidth = kv_bytes_per_token / kv_s if kv_s > 0 else 1e14
    flops = flops_per_pair / pair_s if pair_s > 0 else 1e17
    model = TokenLatencyModel(
        cpu_rows=(1.0, top), cpu_s=(c0 + c1, c0 + c1 * top), linear_tokens=tuple(knots.tolist()),
        linear_s=tuple(linear.tolist()), allreduce_s=(0.0,) * knots.size, kv_bytes_per_token=kv_bytes_per_token,
        decode_bandwidth_bytes_s=bandwidth, attention_flops_per_pair=flops_per_pair, prefill_flops_s=flops,
        lm_head_bytes=0.0, lm_head_flops_per_row=0.0, memory_bandwidth_bytes_s=bandwidth, peak_flops_s=flops,
        cpu_tail_s_per_row=float(c1), cpu_s_mixed_step=float(c_mixed),
        long_context_tokens=knee if long_step or long_row else 0.0, long_context_s_per_token=float(long_step),
        long_context_s_per_row_token=float(long_row))
    names = {"cpu_s_per_step": 0, "cpu_s_per_row": 1, "cpu_s_mixed_step": 2, "kv_s_per_token": -4, "s_per_pair": -3,
             "long_context_s_per_token": -2, "long_context_s_per_row_token": -1}
    return Fit(model, {name: (float(coef[i]), float(errors[i])) for name, i in names.items()})


def predict(model: LatencyModel | TokenLatencyModel, s: Sample) -> float:
    return model.totals_s(s.totals())


def fit_errors(model: LatencyModel | TokenLatencyModel, samples: list[Sample]) -> dict[str, float]:
    if not samples:
        return {}
    measured = np.array([s.seconds for s in samples])
    fitted = np.array([predict(model, s) for s in samples])
    return {"rmse_ms": float(np.sqrt(np.mean((fitted - measured) ** 2)) * 1e3),
            "mean_abs_rel_error": float(np.mean(np.abs(fitted - measured) / measured)),
            "max_abs_rel_error": float(np.max(np.abs(fitted - measured) / measured)),
            "samples": len(samples)}
