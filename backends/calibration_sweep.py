"""The sweep of a calibration: which steps it times (:class:`SweepPlan`) and how it drives a backend to time
them (:class:`Sweeper`, hand-made batches, no engine)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from servegym.backends.base import EMPTY, Backend, StepBatch
from servegym.backends.calibration_fit import Sample

CPU_MAX_BATCH, CPU_MAX_CONTEXT = 64, 512
"""The CPU sweep's default reach: about a minute of small-llama on 2 cores."""
CUDA_MAX_BATCH, CUDA_MAX_CONTEXT = 256, 2048
"""The GPU sweep's default reach. 256 requests of 2,048 tokens hold about 60 GB of KV for Llama-3.2-3B in
16 bits, which fits an 80 GB H100 beside the 6.4 GB of weights; 4,096 tokens would need 120 GB."""
WARMUP_CHUNK = 64
"""Prompt tokens of the untimed warm-up prefills that precede every sweep."""
SCATTER_ROWS = 512
"""At most this many one-token requests a step when :meth:`Sweeper.scatter` shuffles the cache (each row samples a
token, so a step's logits grow with its rows: a large vocabulary on a full GPU must not run out of memory)."""
CONTEXT_SPREAD = 0.875
"""How far a decode point's rows' contexts spread around the point's context ``c``: over ``[c / 8, 15 c / 8]``,
about as a running server's requests are spread over their lifetimes. A batch of unequal contexts costs the CPU
backend 2-5% more than one of equal contexts with the same total (its attention groups rows of similar context),
so a sweep of equal contexts fitted a profile that priced real episodes' decode steps 3-5% low."""
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


def _van_der_corput(k: int) -> float:
    """The base-2 van der Corput sequence: 0, 1/2, 1/4, 3/4, 1/8, ... (``k`` from 0)."""
    value, denominator = 0.0, 1.0
    while k:
        denominator *= 2
        k, bit = divmod(k, 2)
        value += bit / denominator
    return value


def _untimed_step(lengths: np.ndarray) -> int:
    """Tokens of the largest untimed step that prefills rows of ``lengths`` (:meth:`Sweeper._prefill`)."""
    parts = np.array_split(np.minimum(lengths, UNTIMED_TOKENS), -(-lengths.size // UNTIMED_ROWS))
    return int(max(part.sum() for part in parts))


def row_contexts(context: int, rows: int, spread: float) -> np.ndarray:
    """The contexts of a decode point's ``rows`` rows around ``context``: pairs ``context * (1 +- a)`` with ``a``
    0 for the first pair, then ``spread``, ``spread / 2``, ``3 spread / 4``, ``spread / 4``, ... (so any first
    rows spread evenly over ``[(1 - spread) context, (1 + spread) context]``); every even number of first rows, and
    the first row, average ``context`` exactly, unless the 1-token floor clips a row (contexts of 4 or less). At
    least 1 token each; ``spread`` 0: every row holds ``context``."""
    offsets = np.zeros(rows)
    for k in range(1, (rows + 1) // 2):
        offsets[2 * k] = spread * (1.0 - _van_der_corput(k - 1))
    offsets[3::2] = -offsets[2 : rows - 1 : 2]
    return np.maximum(1, context + np.rint(context * offsets)).astype(np.int64)


@dataclass(frozen=True)
class SweepPlan:
    """What a calibration times, each point ``repeats`` times: decode-only steps of every batch size at every
    per-request context, single prefill chunks at every start offset, batched prefills (``prompts`` whole
    prompts of ``tokens`` each in one step, as an engine packs new requests under its token budget), and mixed
    steps (decode batch, prefill chunk) whose decodes hold ``mixed_context`` tokens on average. Decode rows' contexts
    spread by ``context_spread`` around each point's (:func:`row_contexts`; 0: all equal, as sweeps before
    2026-12-03 timed them). The defaults are the CPU sweep (``SweepPlan.up_to(64, 512, max_tokens=2048)``)."""

    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    contexts: tuple[int, ...] = (32, 128, 512)
    chunks: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)
    chunk_starts: tuple[int, ...] = (0, 256)
    mixed: tuple[tuple[int, int], ...] = ((4, 16), (4, 64), (4, 256), (16, 16), (16, 64), (16, 256), (32, 16),
                                          (32, 64), (32, 256))
    mixed_context: int = 128
    repeats: int = 3
    batched: tuple[tuple[int, int], ...] = ((4, 256), (8, 256), (16, 128))
    context_spread: float = CONTEXT_SPREAD

    def __post_init__(self) -> None:
        for name in ("batches", "contexts", "chunks"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"SweepPlan.{name} must be a non-empty tuple of values >= 1, got {values}")
        if not self.chunk_starts or min(self.chunk_starts) < 0:
            raise ValueError(f"SweepPlan.chunk_starts must be non-empty and >= 0, got {self.chunk_starts}")
        if any(min(pair) < 1 for pair in self.mixed):
            raise ValueError(f"SweepPlan.mixed pairs (decode batch, chunk) must be >= 1, got {self.mixed}")
        if any(min(pair) < 1 for pair in self.batched):
            raise ValueError(f"SweepPlan.batched pairs (prompts, tokens) must be >= 1, got {self.batched}")
        if self.mixed_context < 1 or self.repeats < 1:
            raise ValueError(f"SweepPlan.mixed_context and repeats must be >= 1, got {self.mixed_context} and "
                             f"{self.repeats}")
        if not 0 <= self.context_spread < 1:
            raise ValueError(f"SweepPlan.context_spread must be in [0, 1), got {self.context_spread}")

    @classmethod
    def up_to(cls, max_batch: int, max_context: int, repeats: int = 3, max_tokens: int | None = None) -> SweepPlan:
        """Batches 1, 2, 4, ... up to ``max_batch``; contexts 32, 128, 512, ... up to ``max_context``; chunks
        16, 32, ... up to ``max_tokens`` (the largest step, by default ``max_context``; an engine's token budget)
        at starts 0 and ``max_context / 2``; batched prefills of 4 and 8 prompts of ``max_tokens / 8`` tokens and
        16 of ``max_tokens / 16``; mixed steps of ``max_batch / 16``, ``max_batch / 4`` and ``max_batch / 2``
        decodes with chunks of 16, 64 and 256 tokens (each capped at ``max_context``): enough of them to fit what
        a step pays for holding both kinds."""
        max_tokens = max_context if max_tokens is None else max_tokens
        if max_batch < 1 or max_context < 1 or max_tokens < 1:
            raise ValueError(f"max_batch, max_context and max_tokens must be >= 1, got {max_batch}, {max_context} "
                             f"and {max_tokens}")
        eighth, sixteenth = max(1, max_tokens // 8), max(1, max_tokens // 16)
        mixed_batches = sorted({max(1, max_batch // 16), max(1, max_batch // 4), max(1, max_batch // 2)})
        mixed_chunks = sorted({min(16, max_context), min(64, max_context), min(256, max_context)})
        return cls(batches=_ladder(1, 2, max_batch), contexts=_ladder(32, 4, max_context),
                   chunks=_ladder(16, 2, max_tokens), chunk_starts=tuple(sorted({0, max_context // 2})),
                   mixed=tuple(itertools.product(mixed_batches, mixed_chunks)),
                   mixed_context=min(128, max_context), repeats=repeats,
                   batched=((4, eighth), (8, eighth), (16, sixteenth)))

    def rows(self, context: int, rows: int) -> np.ndarray:
        """The contexts of ``rows`` decode rows of a point at ``context`` (:func:`row_contexts`)."""
        return row_contexts(context, rows, self.context_spread)

    def _held(self, context: int, rows: int, growth: int, block_size: int) -> int:
        """Blocks of ``rows`` decode rows around ``context``, each with its generated token and ``growth`` more."""
        return sum(_blocks(int(c) + 1 + growth, block_size) for c in self.rows(context, rows))

    def kv_blocks_needed(self, block_size: int) -> int:
        """KV blocks the sweep holds at its peak: the decode phase keeps ``max(batches)`` requests around the
        longest context, the first of which grows by one token per timed decode step."""
        decode = self._held(max(self.contexts), max(self.batches), len(self.batches) * self.repeats, block_size)
        prefill = _blocks(max(self.chunk_starts) + max(self.chunks) + 1, block_size)
        mixed = max((self._held(self.mixed_context, batch, self.repeats, block_size) + _blocks(chunk + 1, block_size)
                     for batch, chunk in self.mixed), default=0)
        batched = max((n * _blocks(tokens + 1, block_size) for n, tokens in self.batched), default=0)
        return max(decode, prefill, mixed, batched, _blocks(WARMUP_CHUNK + 1, block_size))

    def max_step_tokens(self) -> int:
        """Tokens of the sweep's largest step, timed or not (what a CUDA backend must profile memory for)."""
        filled = [(c, max(self.batches)) for c in self.contexts] + [(self.mixed_context, b) for b, _ in self.mixed]
        untimed = max(_untimed_step(self.rows(c, n)) for c, n in filled)
        return max(untimed, min(UNTIMED_TOKENS, max(self.chunk_starts)), *self.chunks,
                   *(batch + chunk for batch, chunk in self.mixed),
                   *(n * tokens for n, tokens in self.batched), WARMUP_CHUNK)

    def check_fits(self, num_kv_blocks: int, block_size: int) -> None:
        """Raise a clear error when the sweep would overflow a cache of ``num_kv_blocks``."""
        need = self.kv_blocks_needed(block_size)
        if need > num_kv_blocks:
            raise ValueError(f"the sweep needs {need} KV blocks of {block_size} tokens ({max(self.batches)} requests "
                             f"of about {max(self.contexts)} tokens) but the cache has {num_kv_blocks}: lower "
                             "--max-batch or --max-context, or raise --kv-blocks (or free device memory)")


def point_label(group: str, s: Sample) -> str:
    """The sweep point a sample of ``group`` (``decode``, ``prefill`` or ``mixed``) timed, in words (a decode point's
    context is its rows' mean: the point's own for an even batch or one row, a little more for an odd batch)."""
    if group == "decode":
        return f"decode B={s.decode} context={round(s.context / s.decode) - 1}"
    if group == "prefill":
        return f"prefill chunk={s.chunk} start={s.chunk_start}"
    if group == "batched":
        return f"batched prefill {s.prompts} x {s.chunk}"
    return f"{group} B={s.decode} chunk={s.chunk}"


class Sweeper:
    """Drives a backend with hand-made batches (no engine) and times them."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._next_id = 0

    def _new_ids(self, n: int) -> np.ndarray:
        ids = np.arange(self._next_id, self._next_id + n)
        self._next_id += n
        return ids

    def scatter(self, blocks: int, rng: np.random.Generator, rows: int) -> None:
        """Leave the cache's free blocks in a random order, as a server's is after many requests have come and
        gone: ``blocks`` one-block requests are prefilled (one token each, untimed, at most ``rows`` a step) and
        released in a shuffled order, so the sweep's requests then take scattered blocks, not consecutive ones."""
        ids = self._new_ids(blocks)
        for part in np.array_split(ids, -(-ids.size // rows)):
            one = np.ones(part.size, dtype=np.int64)
            self.backend.execute(StepBatch(EMPTY, EMPTY, part, np.zeros(part.size, dtype=np.int64), one, one))
        self.backend.release(rng.permutation(ids))

    def _prefill(self, ids: np.ndarray, tokens: int | np.ndarray, target: int | None = None) -> None:
        """Ingest ``tokens`` prompt tokens of requests ``ids`` (one count for all, or one per request; prompts
        ``target`` long, by default ``tokens``) untimed, at most UNTIMED_ROWS requests of UNTIMED_TOKENS tokens per
        step."""
        lengths = np.broadcast_to(np.asarray(tokens, dtype=np.int64), ids.shape)
        targets = lengths if target is None else np.full(ids.size, target, dtype=np.int64)
        for rows in np.array_split(np.arange(ids.size), -(-ids.size // UNTIMED_ROWS)):
            done = np.zeros(rows.size, dtype=np.int64)
            while (left := lengths[rows] - done).any():
                active = left > 0
                step = np.minimum(UNTIMED_TOKENS, left[active])
                self.backend.execute(StepBatch(EMPTY, EMPTY, ids[rows[active]], done[active], step,
                                               targets[rows[active]]))
                done[active] += step

    def decode(self, plan: SweepPlan, progress: Callable[[str], object] | None = None) -> list[Sample]:
        """Decode steps of every batch size at every context. The repeats are rounds over the batch sizes, not
        back-to-back, so a slow spell of a shared machine lands on one repeat of many points, not on every
        repeat of one (the median then drops it)."""
        samples = []
        for context in plan.contexts:
            ids = self._new_ids(max(plan.batches))
            contexts = plan.rows(context, ids.size)
            self._prefill(ids, contexts)
            for round_ in range(plan.repeats):
                for batch in plan.batches:
                    chosen = ids[:batch]
                    seconds = self.backend.execute(StepBatch(chosen, EMPTY, EMPTY, EMPTY, EMPTY, EMPTY))
                    samples.append(Sample(batch, float(contexts[:batch].sum() + batch), 0, 0, seconds))
                if progress:
                    progress(f"decode context={context} round {round_ + 1}/{plan.repeats}")
            self.backend.release(ids)
        return samples

    def prefill(self, plan: SweepPlan, progress: Callable[[str], object] | None = None) -> list[Sample]:
        """Single prefill chunks at every start offset, in rounds as :meth:`decode`'s."""
        samples = []
        for round_ in range(plan.repeats):
            for start in plan.chunk_starts:
                for chunk in plan.chunks:
                    rid = self._new_ids(1)
                    if start:
                        self._prefill(rid, start, start + chunk)
                    seconds = self.backend.execute(StepBatch(EMPTY, EMPTY, rid, np.array([start]), np.array([chunk]),
                                                             np.array([start + chunk])))
                    samples.append(Sample(0, 0.0, chunk, start, seconds))
                    self.backend.release(rid)
            if progress:
                progress(f"prefill round {round_ + 1}/{plan.repeats}")
        return samples

    def batched(self, plan: SweepPlan) -> list[Sample]:
        """Batched prefills: ``prompts`` whole prompts of ``tokens`` each in one step, in rounds."""
        samples = []
        for _ in range(plan.repeats):
            for prompts, tokens in plan.batched:
                ids = self._new_ids(prompts)
                seconds = self.backend.execute(StepBatch(EMPTY, EMPTY, ids, np.zeros(prompts, dtype=np.int64),
                                                         np.full(prompts, tokens), np.full(prompts, tokens)))
                samples.append(Sample(0, 0.0, tokens, 0, seconds, prompts))
                self.backend.release(ids)
        return samples

    def mixed(self, plan: SweepPlan) -> list[Sample]:
        samples, context = [], plan.mixed_context
        for batch, chunk in plan.mixed:
            ids = self._new_ids(batch)
            contexts = plan.rows(context, batch)
            self._prefill(ids, contexts)
            for _ in range(plan.repeats):
                rid = self._new_ids(1)
                seconds = self.backend.execute(StepBatch(ids, EMPTY, rid, np.array([0]), np.array([chunk]),
                                                         np.array([chunk])))
                samples.append(Sample(batch, float(contexts.sum() + batch), chunk, 0, seconds))
                self.backend.release(rid)
            self.backend.release(ids)
        return samples
