"""Profile schema 2: an iteration's time as a sum of named terms keyed on the tokens it processes.

On a GPU the linear layers' time depends on ``T``, the tokens in the iteration (decodes plus prefill-chunk
tokens): flat while the GEMMs are memory-bound, then growing. Attention does not: decode attention reads every
KV byte of every decoding request, prefill attention does ``chunk x context`` work. So one iteration costs

* ``cpu``: host-side scheduling, input preparation, sampling and output processing, by the number of rows;
* ``linear``: every layer's linear operators (QKV, output, MLP, norms, rotary, activation, residual) and the
  embedding, interpolated (monotone, piecewise linear) from a measured sweep over ``T``;
* ``allreduce``: tensor parallelism's two all-reduces per layer of ``T x hidden`` fp16 values, from a measured
  all-reduce table (zero on one GPU);
* ``decode_attention``: KV bytes read by the decoding requests over the effective memory bandwidth;
* ``prefill_attention``: FLOPs of each chunk token against its context over the effective FLOP rate;
* ``lm_head``: the vocabulary projection of the rows that emit a token, on the roofline (weights read once,
  or FLOPs, whichever is slower);
* ``launch``: where the serving runtime launches kernels from Python every iteration (``eager``), the GPU work
  cannot end before the host has launched it: the iteration waits ``max(0, launch_floor_s - GPU terms)``. Zero
  where iterations replay CUDA graphs (:mod:`servegym.backends.runtimes`).

Beyond its last measured batch the ``cpu`` term continues at ``cpu_tail_s_per_row`` (a stated model: host work
per request, the least-squares slope over the measured batches); a file without it continues the last segment.

:func:`servegym.backends.build.build_profile` fills one from Vidur-format tables; each term's provenance is in
the profile file.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field, fields

from servegym.backends.base import BatchTotals, StepBatch, batch_totals
from servegym.backends.profile_limits import ProfileValueError, check_noise, check_term_seconds

__all__ = ["TERMS", "ProfileValueError", "TokenLatencyModel"]


def _interp(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """Piecewise-linear through the knots; beyond the last knot the last segment's slope continues, below the
    first knot the first value holds. (Plain Python: a scalar lookup per step, faster than ``np.interp``.)"""
    if x <= xs[0]:
        return ys[0]
    i = bisect.bisect_right(xs, x)
    if i == len(xs):
        if i == 1:
            return ys[0]
        i -= 1  # extrapolate the last segment
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _check_knots(name: str, xs: tuple[float, ...], ys: tuple[float, ...]) -> None:
    if len(xs) == 0 or len(xs) != len(ys):
        raise ProfileValueError(f"{name}: need as many knots as values, at least one (got {len(xs)}, {len(ys)})")
    if any(not math.isfinite(v) for v in (*xs, *ys)):
        raise ProfileValueError(f"{name}: knots and values must be finite numbers")
    if any(b <= a for a, b in itertools.pairwise(xs)):
        raise ProfileValueError(f"{name}: knots must increase strictly")
    if any(b < a for a, b in itertools.pairwise(ys)) or ys[0] < 0:
        raise ProfileValueError(f"{name}: values must be >= 0 and non-decreasing (a monotone fit)")


@dataclass(frozen=True)
class TokenLatencyModel:
    """Schema-2 iteration latency: ``cpu + max(linear + allreduce + decode_attention + prefill_attention + lm_head,
    launch_floor_s)``; :meth:`terms` names the wait for the launch floor ``launch``."""

    cpu_rows: tuple[float, ...] = field(metadata={"help": "knots: requests (rows) in the iteration"})
    cpu_s: tuple[float, ...] = field(metadata={"help": "host-side seconds per iteration at each knot"})
    linear_tokens: tuple[float, ...] = field(metadata={"help": "knots: tokens in the iteration (T)"})
    linear_s: tuple[float, ...] = field(metadata={"help": "all layers' linear operators plus embedding (s)"})
    allreduce_s: tuple[float, ...] = field(
        metadata={"help": "all layers' tensor-parallel all-reduces at each linear_tokens knot (s); zeros on one GPU"}
    )
    kv_bytes_per_token: float = field(metadata={"help": "K and V bytes per token over all layers, per GPU"})
    decode_bandwidth_bytes_s: float = field(
        metadata={"help": "effective memory bandwidth of decode attention: data-sheet bandwidth x efficiency"}
    )
    attention_flops_per_pair: float = field(
        metadata={"help": "FLOPs per (query token, context token) pair over all layers, per GPU: 4 x heads x dim"}
    )
    prefill_flops_s: float = field(
        metadata={"help": "effective FLOP/s of prefill attention: stated fp16 peak x efficiency"}
    )
    lm_head_bytes: float = field(metadata={"help": "vocabulary-projection weight bytes per GPU"})
    lm_head_flops_per_row: float = field(metadata={"help": "2 x hidden x vocab / TP FLOPs per emitting row"})
    memory_bandwidth_bytes_s: float = field(metadata={"help": "data-sheet memory bandwidth (bytes/s)"})
    peak_flops_s: float = field(metadata={"help": "stated fp16 dense peak FLOP/s"})
    noise_cv: float = field(default=0.0, metadata={"help": "coefficient of variation of multiplicative noise"})
    launch_floor_s: float = field(
        default=0.0, metadata={"help": "host seconds to launch an iteration's kernels (eager runtimes; 0 with CUDA "
                                       "graphs): the GPU terms of an iteration take at least this long"})
    cpu_tail_s_per_row: float | None = field(
        default=None, metadata={"help": "cpu seconds per request beyond the last cpu knot (None: the last "
                                        "segment's slope continues)"})
    cpu_s_mixed_step: float = field(
        default=0.0, metadata={"help": "cpu seconds a step pays when it holds both decoding and prefilling rows (a "
                                       "backend whose attention runs each kind apart; fitted by calibrate, 0 in "
                                       "the GPU tables)"})
    long_context_tokens: float = field(
        default=0.0, metadata={"help": "knee of the long-context term: decoding rows' mean KV context (tokens) "
                                       "above which decode attention costs extra (fitted by calibrate; 0 and no "
                                       "cost in the GPU tables)"})
    long_context_s_per_token: float = field(
        default=0.0, metadata={"help": "seconds per step per token of the decoding rows' mean context above the "
                                       "knee"})
    long_context_s_per_row_token: float = field(
        default=0.0, metadata={"help": "seconds per decoding row per token of their mean context above the knee"})

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "cpu_tail_s_per_row":
                continue
            if "tuple" in str(f.type):  # a table: a list of finite numbers, never a bare number
                if not isinstance(value, tuple | list) or not all(
                        not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) for v in value):
                    raise ProfileValueError(f"{f.name} must be a list of finite numbers, got {_short(value)}")
                object.__setattr__(self, f.name, tuple(float(v) for v in value))
            elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ProfileValueError(f"{f.name} must be a finite number, got {value!r}")
            elif value < 0:
                raise ProfileValueError(f"{f.name} must be >= 0, got {value!r}")
        _check_knots("cpu_rows/cpu_s", self.cpu_rows, self.cpu_s)
        _check_knots("linear_tokens/linear_s", self.linear_tokens, self.linear_s)
        _check_knots("linear_tokens/allreduce_s", self.linear_tokens, self.allreduce_s)
        # Lookups memoised per row and token count (not fields: equality and the profile file ignore them).
        object.__setattr__(self, "_cpu_memo", {})
        object.__setattr__(self, "_linear_memo", {})
        for name in ("decode_bandwidth_bytes_s", "prefill_flops_s", "memory_bandwidth_bytes_s", "peak_flops_s"):
            if getattr(self, name) <= 0:
                raise ProfileValueError(f"{name} must be > 0")
        self._check_limits()

    def _check_limits(self) -> None:
        """No term charges more than ``MAX_TERM_S`` per iteration or per unit of work (``profile_limits``)."""
        for name in ("cpu_s", "linear_s", "allreduce_s"):
            check_term_seconds(name, max(getattr(self, name)))
        check_term_seconds("launch_floor_s", self.launch_floor_s)
        if self.cpu_tail_s_per_row is not None:
            check_term_seconds("cpu_tail_s_per_row", self.cpu_tail_s_per_row, "request")
        check_term_seconds("kv_bytes_per_token / decode_bandwidth_bytes_s",
                           self.kv_bytes_per_token / self.decode_bandwidth_bytes_s, "KV token read")
        check_term_seconds("attention_flops_per_pair / prefill_flops_s",
                           self.attention_flops_per_pair / self.prefill_flops_s, "query-key pair")
        check_term_seconds("lm_head_bytes / memory_bandwidth_bytes_s",
                           self.lm_head_bytes / self.memory_bandwidth_bytes_s)
        check_term_seconds("lm_head_flops_per_row / peak_flops_s", self.lm_head_flops_per_row / self.peak_flops_s,
                           "emitting row")
        check_term_seconds("cpu_s_mixed_step", self.cpu_s_mixed_step)
        check_term_seconds("long_context_s_per_token", self.long_context_s_per_token, "context token")
        check_term_seconds("long_context_s_per_row_token", self.long_context_s_per_row_token, "context token")
        check_noise(self.noise_cv)

    def _long_context_s(self, decodes: int, decode_context: float) -> float:
        """The long-context term: a CPU backend's decode attention costs more per token at long contexts than the
        linear KV term says (docs/REAL_BACKEND.md); ``over`` is the decoding rows' mean context above the knee."""
        if not decodes:
            return 0.0
        over = max(0.0, decode_context / decodes - self.long_context_tokens)
        return over * (self.long_context_s_per_token + decodes * self.long_context_s_per_row_token)

    # ------------------------------------------------------------------ terms
    def terms(self, rows: int, tokens: float, decode_context: float, prefill_pairs: float,
              emitting_rows: int, prefill_rows: int = 0) -> dict[str, float]:
        """Each term's seconds for an iteration of ``rows`` requests (``prefill_rows`` of them prefilling) and
        ``tokens`` tokens, whose decodes read ``decode_context`` KV tokens and whose prefill chunks attend over
        ``prefill_pairs`` (query, key) pairs."""
        if rows == 0:
            return dict.fromkeys(TERMS, 0.0)
        terms = {
            "cpu": self._cpu(rows) + (self.cpu_s_mixed_step if 0 < prefill_rows < rows else 0.0),
            "linear": _interp(tokens, self.linear_tokens, self.linear_s),
            "allreduce": _interp(tokens, self.linear_tokens, self.allreduce_s),
            "decode_attention": decode_context * self.kv_bytes_per_token / self.decode_bandwidth_bytes_s
                                + self._long_context_s(rows - prefill_rows, decode_context),
            "prefill_attention": prefill_pairs * self.attention_flops_per_pair / self.prefill_flops_s,
            "lm_head": max(self.lm_head_bytes / self.memory_bandwidth_bytes_s,
                           emitting_rows * self.lm_head_flops_per_row / self.peak_flops_s) if emitting_rows else 0.0,
        }
        gpu = sum(terms.values()) - terms["cpu"]
        terms["launch"] = max(0.0, self.launch_floor_s - gpu)
        return terms

    def _cpu(self, rows: int) -> float:
        """The ``cpu`` term: the knots, then ``cpu_tail_s_per_row`` past the last one where the profile states it."""
        if self.cpu_tail_s_per_row is not None and rows > self.cpu_rows[-1]:
            return self.cpu_s[-1] + (rows - self.cpu_rows[-1]) * self.cpu_tail_s_per_row
        return _interp(rows, self.cpu_rows, self.cpu_s)

    def total_s(self, rows: int, tokens: float, decode_context: float, prefill_pairs: float,
                emitting_rows: int, prefill_rows: int = 0) -> float:
        """The sum of :meth:`terms`, without building the dict (the per-step path)."""
        if rows == 0:
            return 0.0
        cpu = self._cpu_memo.get(rows)
        if cpu is None:
            cpu = self._cpu_memo[rows] = self._cpu(rows)
        if 0 < prefill_rows < rows:  # decodes beside prefills
            cpu += self.cpu_s_mixed_step
        linear = self._linear_memo.get(tokens)
        if linear is None:
            linear = self._linear_memo[tokens] = (_interp(tokens, self.linear_tokens, self.linear_s),
                                                  _interp(tokens, self.linear_tokens, self.allreduce_s))
        total = (cpu + linear[0] + linear[1]
                 + decode_context * self.kv_bytes_per_token / self.decode_bandwidth_bytes_s
                 + prefill_pairs * self.attention_flops_per_pair / self.prefill_flops_s)
        if self.long_context_s_per_token or self.long_context_s_per_row_token:  # calibrated CPU profiles
            total += self._long_context_s(rows - prefill_rows, decode_context)
        if emitting_rows:
            total += max(self.lm_head_bytes / self.memory_bandwidth_bytes_s,
                         emitting_rows * self.lm_head_flops_per_row / self.peak_flops_s)
        if self.launch_floor_s and total - cpu < self.launch_floor_s:  # (summed as before without a floor)
            total = cpu + self.launch_floor_s
        return total

    def iteration_s(self, batch: StepBatch) -> float:
        return self.totals_s(batch_totals(batch))

    def totals_s(self, t: BatchTotals) -> float:
        """:meth:`iteration_s` of any batch with these totals."""
        decodes = t.num_decodes
        if not t.num_prefills:
            return self.total_s(decodes, decodes, t.decode_context, 0.0, decodes)
        return self.total_s(decodes + t.num_prefills, decodes + t.prefill_tokens, t.decode_context, t.prefill_pairs,
                            decodes + t.num_completes, t.num_prefills)

    # ------------------------------------------------------------------ summaries
    def decode_s(self, batch: int, context: float = 0.0) -> float:
        """An iteration of ``batch`` decoding requests, each holding ``context`` KV tokens."""
        return self.total_s(batch, batch, batch * context, 0.0, batch)

    def prefill_s(self, prompt: int, batch: int = 1) -> float:
        """An iteration that prefills ``batch`` whole prompts of ``prompt`` tokens, no decodes."""
        pairs = batch * prompt * (prompt + 1) / 2.0
        return self.total_s(batch, batch * prompt, 0.0, pairs, batch)

    @property
    def l_min_s(self) -> float:
        """A one-request decode iteration with an empty context: the floor of a decode step."""
        return self.decode_s(1)

    @property
    def saturation_batch(self) -> int:
        """``B0``: the largest decode batch whose iteration stays within 10% of :attr:`l_min_s` (context 0)."""
        floor, batch = self.l_min_s, 1
        while batch < 65536 and self.decode_s(batch + 1) <= 1.1 * floor:
            batch += 1
        return batch


TERMS = ("cpu", "linear", "allreduce", "decode_attention", "prefill_attention", "lm_head", "launch")
"""The named terms of :meth:`TokenLatencyModel.terms`, in the profile's order."""


def _short(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
