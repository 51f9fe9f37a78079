"""The serving engine: one call to :meth:`Engine.step` is one iteration (one forward pass).

Running requests live in a dense table (one row per request, in activation order) so that the per-step
work is a handful of numpy operations, independent of how many requests the episode holds.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from servegym.backends.base import EMPTY, Backend, StepBatch
from servegym.engine.config import EngineConfig, Recompute
from servegym.engine.kv import first_chunk_tokens, num_blocks
from servegym.engine.log import EpisodeLog, RejectReason, State, StepRow
from servegym.engine.preemption import pick_victims


class Col(IntEnum):
    """Columns of the engine's running table (one int64 row per running request, in activation order).

    The first six are what policies observe of a running request (:data:`RUNNING_OBS_COLUMNS`).
    """

    NUM_PROMPT_TOKENS = 0
    NUM_KV_TOKENS = 1
    """Tokens held in the KV cache (prompt ingested so far plus generated tokens)."""
    NUM_GENERATED = 2
    """Output tokens generated, counting those recomputed after a preemption."""
    OUTPUT_LO = 3
    OUTPUT_HI = 4
    """The output-length interval policies observe (see ``LengthMode``)."""
    NUM_PREFILL_LEFT = 5
    """Tokens still to ingest before the request decodes (0 once decoding)."""
    REQUEST_ID = 6
    NUM_OUTPUT_TOKENS = 7
    """The true output length: the request finishes when it has generated this many."""
    SEGMENT_START = 8
    """The step of the request's first token in its current decode segment (-1 before it)."""
    PREFILL_TARGET = 9
    """Tokens the prefill ingests in all: prompt plus output tokens to recompute."""


RUNNING_OBS_COLUMNS = ("num_prompt_tokens", "num_kv_tokens", "num_generated", "output_lo", "output_hi",
                       "num_prefill_left")
"""Names of the observable running-table columns, ``Col`` 0-5 in order."""
_NUM_OBS = len(RUNNING_OBS_COLUMNS)
# Plain-int aliases for the hot path (numpy indexes faster with int than with an IntEnum member).
PROMPT, KV, GEN, LO, HI, PREFILL_LEFT, REQ, OUT, SEG, TARGET = (int(c) for c in Col)


class StepOutcome(NamedTuple):
    """What one iteration of one engine did. Counts are of requests unless named tokens."""

    dt_s: float
    num_decode_tokens: int
    """Output tokens emitted (decodes plus first tokens of completed prefills)."""
    num_prefill_tokens: int
    num_admitted: int
    num_refused: int
    """Requests the action asked to admit that did not fit (admission stops at the first)."""
    num_preemptions: int
    num_finished: int


class Plan(NamedTuple):
    """One iteration's tokens when some rows are still prefilling (indexes into the running table).

    Few chunks are planned in plain lists (numpy's per-call cost would dominate), many in arrays.
    """

    decoding: np.ndarray | slice
    """The running rows that decode one token this iteration: a boolean mask, or a slice of the table's head."""
    prefill_rows: np.ndarray
    """Prefilling rows that ingest a chunk (a head of them in table order, until the token budget runs out)."""
    unscheduled_rows: np.ndarray
    """The other prefilling rows: no token budget was left for them this iteration."""
    chunk: list[int] | np.ndarray
    """Prompt tokens each of ``prefill_rows`` ingests (lists up to ``SMALL_HEAD`` rows, arrays beyond)."""
    completes: list[bool] | np.ndarray
    """Per prefill row: this chunk finishes its prefill, so it also samples its first token."""
    new_tokens: list[int] | np.ndarray
    """KV tokens each prefill row gains (its chunk, plus its first token when the chunk completes it)."""


_IDLE = StepOutcome(0.0, 0, 0, 0, 0, 0, 0)
SMALL_HEAD = 8
"""Prefill chunks up to this many per iteration are planned in plain Python (numpy's per-call cost would
dominate); more, in numpy."""


class EngineBase:
    """One container's continuous-batching LLM serving engine over a paged KV cache: what every implementation of
    its iteration shares (construction, episodes, arrivals, views, checks).

    Two implementations provide ``step``: :class:`Engine` in Python, the specification, and
    :class:`~servegym.engine.compiled.CompiledEngine`, the same iteration compiled. Use either through a
    :class:`~servegym.engine.Cluster`, which picks one (see :func:`~servegym.engine.compiled.engine_class`).

    The engine serves the requests routed to it (:meth:`receive`); a :class:`~servegym.engine.Cluster`
    owns the workload, the routing and the event clock across containers.

    Args:
        config: scheduler-independent engine settings.
        backend: times iterations (calibrated model or real model).
        container: this engine's index in its pool.
    """

    def __init__(self, config: EngineConfig, backend: Backend, container: int = 0) -> None:
        self.config = config
        self.backend = backend
        self.container = container
        self.num_kv_blocks = config.num_kv_blocks or backend.num_kv_blocks
        self.block_size = config.block_size or backend.block_size
        if backend.owns_cache and (self.num_kv_blocks, self.block_size) != (
            backend.num_kv_blocks, backend.block_size
        ):
            raise ValueError(
                f"the backend's KV cache has {backend.num_kv_blocks} blocks of {backend.block_size} tokens; "
                f"the engine config asks for {self.num_kv_blocks} of {self.block_size}"
            )
        base = backend.baseline_step_s
        self.idle_tick_s: float = float(config.idle_tick_s or base or 0.05)
        self._run = np.zeros((config.max_num_seqs, len(Col)), dtype=np.int64)
        # Episode state: declared here, set by _start() (from here and from reset()).
        self.log: EpisodeLog | None = None
        self.clock: float
        """This container's time (s): the end of its last iteration."""
        self.ready_at: float
        """When the model is loaded; nothing is admitted before (inf: cold, never loaded)."""
        self.idle_since: float
        self.waiting: np.ndarray
        """Request ids waiting to be admitted, queue head first (preempted requests go to the front)."""
        self.waiting_version: int
        """Bumped whenever ``waiting`` changes, so observers can cache what they derive from it."""
        self.num_running: int
        self.num_prefilling: int
        self.num_used_blocks: int
        self.token_load: int
        """Sum over running rows of ``output_hi - num_generated``: an upper bound on tokens still to emit."""
        self.num_arrived: int
        self.num_finished: int
        self.last_finished_ids: np.ndarray = np.zeros(0, dtype=np.int64)
        """Request ids that finished in the latest iteration that finished any (read it when
        ``last.num_finished > 0``)."""
        self.num_rejected: int
        self.itl_last: float
        self.itl_smoothed: float
        self.kv_free_delta: float
        """EMA of the per-step change of the free KV fraction (negative while the cache fills)."""
        self.last_dt: float
        self.step_index: int
        self.last: StepOutcome
        """What the last iteration did."""
        self._kv_free_prev: float
        self._num_prefill_seqs: int
        self._finish_countdown: int
        """Iterations before any decoding request can finish (0: check now)."""
        self._phases: np.ndarray | None
        """Decode rows per block phase; None after the table changes."""
        self._start(0.0, -math.inf)

    # ------------------------------------------------------------------ episode
    def reset(self, log: EpisodeLog, rng: np.random.Generator, clock: float, ready_at: float = -math.inf) -> None:
        """Start an episode at ``clock`` with an empty queue; the model is loaded from ``ready_at`` on."""
        self.log = log
        self.backend.reset(rng)
        self._start(clock, ready_at)

    def _start(self, clock: float, ready_at: float) -> None:
        self.clock = clock
        self.ready_at = ready_at
        self.idle_since = clock
        self.waiting = EMPTY
        self.waiting_version = 0
        self.num_running = self.num_prefilling = self.num_used_blocks = self.token_load = 0
        self.num_arrived = self.num_finished = self.num_rejected = 0
        self.itl_last = 0.0
        self.itl_smoothed = float(self.backend.baseline_step_s or 0.0)
        self.kv_free_delta = 0.0
        self.last_dt = 0.0
        self.step_index = 0
        self.last = _IDLE
        self._kv_free_prev = 1.0
        self._num_prefill_seqs = 0
        self._finish_countdown = 0
        self._phases = None

    @property
    def has_work(self) -> bool:
        return self.waiting.size > 0 or self.num_running > 0

    @property
    def running(self) -> np.ndarray:
        """The observable columns of the running table (rows in activation order), as a copy."""
        return self._run[: self.num_running, :_NUM_OBS].copy()

    @property
    def running_ids(self) -> np.ndarray:
        """Request ids of the running rows, in activation order (oldest first)."""
        return self._run[: self.num_running, REQ].copy()

    def copy_running_into(self, out: np.ndarray) -> None:
        """Write the observable running columns into the first rows of ``out`` (no allocation)."""
        out[: self.num_running] = self._run[: self.num_running, :_NUM_OBS]

    def receive(self, ids: np.ndarray, now: float) -> tuple[int, float]:
        """Queue requests routed here at time ``now``; reject those that could never fit in the KV cache.

        Returns the number rejected and the summed lag ``now - arrival`` of the accepted ones.
        """
        log = self.log
        if self.clock < now:  # the engine sat idle until now
            self.clock = now
        self.num_arrived += ids.size
        # ids ascend; consecutive ones (every arrival batch of a one-container pool) index as a slice, far cheaper
        # than a list of indexes.
        where = slice(int(ids[0]), int(ids[-1]) + 1) if ids.size and ids[-1] - ids[0] == ids.size - 1 else ids
        log.container[where] = self.container
        never_fits = log.num_prompt_tokens[where] + log.num_output_tokens[where] > self.num_kv_blocks * self.block_size
        rejected = int(np.count_nonzero(never_fits))
        if rejected:
            bad = ids[never_fits]
            log.state[bad] = State.REJECTED
            log.reject_reason[bad] = RejectReason.EXCEEDS_KV_CAPACITY
            log.finish_s[bad] = log.arrival_s[bad]
            self.num_rejected += rejected
            ids = where = ids[~never_fits]
        if ids.size:
            log.state[where] = State.WAITING
            log.enqueue_step[where] = self.step_index
            self.waiting = np.concatenate([self.waiting, ids])
            self.waiting_version += 1
        return rejected, float((now - log.arrival_s[where]).sum())

    # ------------------------------------------------------------------ preemption
    def _evict(self, rows: np.ndarray) -> int:
        """Preempt ``rows`` by recompute: free their blocks and put them at the queue front (a rare path, shared by
        both engines; ``_remove_rows`` is each engine's own). Under ``recompute="restart"`` they lose their
        generated tokens and start again from the prompt."""
        run, log = self._run, self.log
        ids = run[rows, REQ].copy()
        log.state[ids] = State.PREEMPTED
        log.num_generated_at_preemption[ids] = run[rows, GEN] if self.config.recompute is Recompute.KEEP_OUTPUT else 0
        log.num_preemptions[ids] += 1
        seg = run[rows, SEG]
        opened = seg >= 0
        log.seg_req.extend(ids[opened].tolist())
        log.seg_first.extend(seg[opened].tolist())
        log.seg_last.extend([self.step_index - 1] * int(opened.sum()))
        self.num_prefilling -= int(np.count_nonzero(run[rows, PREFILL_LEFT]))
        self._remove_rows(rows)
        self.waiting = np.concatenate([ids, self.waiting])
        self.waiting_version += 1
        self.backend.release(ids)
        return ids.size

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Raise AssertionError if this engine's queue, running table or KV accounting is inconsistent."""
        log, n, bs = self.log, self.num_running, self.block_size
        rows = self._run[:n]
        held = int(num_blocks(rows[:, KV], bs).sum())
        if held != self.num_used_blocks or not 0 <= self.num_used_blocks <= self.num_kv_blocks:
            raise AssertionError(f"KV accounting broken: rows hold {held}, used={self.num_used_blocks}")
        if np.unique(self.waiting).size != self.waiting.size:
            raise AssertionError("a request is queued twice")
        states = log.state[self.waiting]
        if not np.all((states == State.WAITING) | (states == State.PREEMPTED)):
            raise AssertionError("a queued request is not waiting")
        run_states = log.state[rows[:, REQ]]
        if not np.all((run_states == State.PREFILLING) | (run_states == State.DECODING)):
            raise AssertionError("a running request is not prefilling or decoding")
        if int((rows[:, HI] - rows[:, GEN]).sum()) != self.token_load:
            raise AssertionError("token load drifted")
        if int(np.count_nonzero(rows[:, PREFILL_LEFT])) != self.num_prefilling:
            raise AssertionError("prefilling count drifted")
        if np.any(rows[:, GEN] > rows[:, OUT]):
            raise AssertionError("a request generated past its output length")
        decoding = rows[:, PREFILL_LEFT] == 0
        if self._phases is not None and not np.array_equal(
            self._phases, np.bincount((rows[decoding, KV] - self.step_index) % bs, minlength=bs)
        ):
            raise AssertionError("the KV block phases of the decoding rows drifted from the running table")
        if decoding.any() and self._finish_countdown > int((rows[decoding, OUT] - rows[decoding, GEN]).min()):
            raise AssertionError("the finish countdown overshoots a decoding request's remaining tokens")


class Engine(EngineBase):
    """The engine's iteration in Python and numpy: the specification of what one ``step`` does (the compiled
    engine reproduces it float for float)."""

    # ------------------------------------------------------------------ step
    def step(self, admit: np.ndarray, next_arrival_s: float = math.inf) -> StepOutcome:
        """Run one iteration.

        Args:
            admit: queue positions to admit, in admission order (distinct, each in ``[0, len(queue))``).
                Admission stops at the first request that does not fit (``max_num_seqs`` or free KV
                blocks for its first chunk); it and the rest stay waiting (counted as ``refused``).
                Nothing is admitted while the model is still loading (``clock < ready_at``).
            next_arrival_s: when the next request reaches the pool; an engine with nothing to do jumps there.
        """
        had_work = self.waiting.size or self.num_running
        admitted, refused = self._admit(admit) if len(admit) else (0, 0)
        preempted = 0
        if self.num_running:
            plan, need = self._plan()
            while need > self.num_kv_blocks - self.num_used_blocks:
                rows = self._run[: self.num_running]
                preempted += self._evict(pick_victims(self.config.preemption, rows[:, GEN], rows[:, LO], rows[:, HI]))
                plan, need = self._plan()
        if self.num_running:
            decode_tokens, prefill_tokens, finished = self._execute(plan, need)
        else:
            self._idle(next_arrival_s)
            decode_tokens = prefill_tokens = finished = 0
        if had_work and not (self.waiting.size or self.num_running):
            self.idle_since = self.clock
        kv_free = 1.0 - self.num_used_blocks / self.num_kv_blocks
        a = self.config.itl_smoothing
        self.kv_free_delta += a * ((kv_free - self._kv_free_prev) - self.kv_free_delta)
        self._kv_free_prev = kv_free
        self.log.step_rows[self.container].append(StepRow(
            self.clock, self.last_dt, decode_tokens, self._num_prefill_seqs, prefill_tokens, self.num_running,
            self.waiting.size, self.num_used_blocks, admitted, preempted, finished,
        ))
        self.step_index += 1
        self.last = StepOutcome(self.last_dt, decode_tokens, prefill_tokens, admitted, refused, preempted, finished)
        if self.config.check_invariants:
            self.check_invariants()
        return self.last

    def _admit(self, positions: np.ndarray) -> tuple[int, int]:
        positions = np.asarray(positions)
        if positions.dtype.kind not in "iu":
            raise IndexError(f"queue positions must be integers, got dtype {positions.dtype}")
        if self.clock < self.ready_at:
            return 0, len(positions)
        cfg, log, run, bs = self.config, self.log, self._run, self.block_size
        free = self.num_kv_blocks - self.num_used_blocks
        taken: list[int] = []
        for pos in positions.tolist():
            if not 0 <= pos < self.waiting.size:
                raise IndexError(f"queue position {pos} out of range for a queue of {self.waiting.size}")
            rid = int(self.waiting[pos])
            target = int(log.num_prompt_tokens[rid] + log.num_generated_at_preemption[rid])
            blocks = num_blocks(first_chunk_tokens(target, cfg.prefill_chunk_tokens), bs)
            if self.num_running >= cfg.max_num_seqs or blocks > free:
                break
            free -= blocks
            generated = log.num_generated_at_preemption[rid]
            run[self.num_running] = (log.num_prompt_tokens[rid], 0, generated, log.output_lo[rid], log.output_hi[rid],
                                     target, rid, log.num_output_tokens[rid], -1, target)
            self.num_running += 1
            self.num_prefilling += 1
            self.token_load += int(log.output_hi[rid] - log.num_generated_at_preemption[rid])
            log.state[rid] = State.PREFILLING
            if math.isnan(log.admit_s[rid]):
                log.admit_s[rid] = self.clock
            taken.append(pos)
        if taken:
            # Distinct positions whose largest is len - 1 are the queue's head (FCFS-like admission).
            head = max(taken) == len(taken) - 1
            self.waiting = self.waiting[len(taken):] if head else np.delete(self.waiting, taken)
            self.waiting_version += 1
        return len(taken), len(positions) - len(taken)

    def _plan(self) -> tuple[Plan | None, int]:
        """Decide this iteration's tokens; return the plan and the KV blocks it needs."""
        n, run, bs = self.num_running, self._run, self.block_size
        # A decoding row needs a new block when its KV count is a multiple of the block size. Decoding rows
        # gain one token per iteration, so counting them by (KV - step) mod block size makes that count a
        # lookup, kept as rows start decoding and rebuilt only after rows leave.
        if self._phases is None:
            kv = run[:n, KV] if self.num_prefilling == 0 else run[:n, KV][run[:n, PREFILL_LEFT] == 0]
            self._phases = np.bincount((kv - self.step_index) % bs, minlength=bs)
        need = int(self._phases[-self.step_index % bs])
        if self.num_prefilling == 0:
            return None, need
        cfg = self.config
        left = run[:n, PREFILL_LEFT]
        pre_rows = left.nonzero()[0]
        budget = cfg.max_num_batched_tokens - (n - pre_rows.size)
        if cfg.max_prefill_tokens is not None:
            budget = min(budget, cfg.max_prefill_tokens)
        plan, prefill_need = self._chunks(left, pre_rows, budget)
        return plan, need + prefill_need

    def _chunks(self, left: np.ndarray, pre_rows: np.ndarray, budget: int) -> tuple[Plan, int]:
        """Give prefilling rows chunks in table order until the token budget runs out: a head of rows gets
        tokens, the tail none. Returns the plan and the KV blocks the chunks need."""
        run, bs, limit = self._run, self.block_size, self.config.prefill_chunk_tokens
        rests = left[pre_rows]
        head = pre_rows.size
        if head > SMALL_HEAD:
            want = np.minimum(rests, limit)
            before = np.cumsum(want) - want
            head = int(np.searchsorted(before, budget))  # rows whose chunk starts within the budget
        tail, need = pre_rows[head:], 0
        # Decoding rows: a slice when the prefilling rows are the table's tail (the newest admissions).
        first = left.size - pre_rows.size
        decoding = slice(0, first) if pre_rows[0] == first else left == 0
        if head > SMALL_HEAD:  # many chunks (a small C): in numpy
            chunk = np.minimum(budget - before[:head], want[:head])
            done = chunk == rests[:head]
            new = chunk + done
            kv = run[pre_rows[:head], KV]
            need += int((num_blocks(kv + new, bs) - num_blocks(kv, bs)).sum())
            return Plan(decoding, pre_rows[:head], tail, chunk, done, new), need
        chunks, completes, new_tokens, wanted = [], [], [], 0
        for row, rest in zip(pre_rows[:head].tolist(), rests[:head].tolist(), strict=True):
            if wanted >= budget:
                break
            want_row = min(rest, limit)
            tokens = min(budget - wanted, want_row)
            wanted += want_row
            done_row = tokens == rest
            chunks.append(tokens)
            completes.append(done_row)
            new_tokens.append(tokens + done_row)
            kv_row = int(run[row, KV])
            need += -(-(kv_row + tokens + done_row) // bs) - -(-kv_row // bs)
        if len(chunks) < head:  # the budget ran out within the first SMALL_HEAD rows
            tail = pre_rows[len(chunks):]
        return Plan(decoding, pre_rows[: len(chunks)], tail, chunks, completes, new_tokens), need

    def _execute(self, plan: Plan | None, need: int) -> tuple[int, int, int]:
        n, run = self.num_running, self._run
        if plan is None:
            batch = StepBatch(run[:n, REQ], run[:n, KV], EMPTY, EMPTY, EMPTY, EMPTY)
            prefill_tokens, self._num_prefill_seqs = 0, 0
        else:
            decoding, rows = plan.decoding, plan.prefill_rows
            target, start = run[rows, TARGET], run[rows, TARGET] - run[rows, PREFILL_LEFT]
            chunk = np.array(plan.chunk, dtype=np.int64)
            batch = StepBatch(run[:n, REQ][decoding], run[:n, KV][decoding], run[rows, REQ], start, chunk, target)
            prefill_tokens = sum(plan.chunk) if isinstance(plan.chunk, list) else int(chunk.sum())
            self._num_prefill_seqs = len(plan.chunk)
        decode_tokens = batch.decode_ids.size
        dt = self.backend.execute(batch)
        if not (dt > 0 and math.isfinite(dt)):
            raise RuntimeError(f"backend returned an invalid step latency {dt!r}")
        dt = float(dt)  # a numpy float32 would otherwise turn the clock into float32
        self.clock += dt
        self.last_dt = dt
        if decode_tokens:
            self.itl_last = dt
            self.itl_smoothed += self.config.itl_smoothing * (dt - self.itl_smoothed)
        self.num_used_blocks += need
        # Every row as if it decoded; prefilling rows are corrected below. Rows left without prefill budget
        # usually form the table's tail (the newest admissions), which then is simply skipped.
        unscheduled = EMPTY if plan is None else plan.unscheduled_rows
        if unscheduled.size and unscheduled[0] == n - unscheduled.size:
            run[: unscheduled[0], KV : GEN + 1] += 1
            unscheduled = EMPTY
        else:
            run[:n, KV : GEN + 1] += 1
        self._finish_countdown -= 1
        if plan is not None:
            decode_tokens += self._advance_prefills(plan, unscheduled)
        self.token_load -= decode_tokens
        if self._finish_countdown <= 0:
            # Only decoding rows can finish; prefilling rows still have their output ahead of them.
            left = run[:n, OUT] - run[:n, GEN]
            done = (left == 0).nonzero()[0]
            if done.size:
                self._finish(done)
            n = self.num_running
            decoding_left = run[:n, OUT] - run[:n, GEN] + run[:n, PREFILL_LEFT] * (1 << 40)
            self._finish_countdown = int(decoding_left.min()) if n else 0
            return decode_tokens, prefill_tokens, int(done.size)
        return decode_tokens, prefill_tokens, 0

    def _advance_prefills(self, plan: Plan, undo: np.ndarray) -> int:
        """Apply the chunks of the prefilling rows (after the table-wide +1, which ``undo`` rows must give back);
        return their first tokens.

        A row whose chunk completes its prefill samples its first token and starts decoding; the finish
        countdown then covers it (it may finish at once, when that token was its last).
        """
        run, log, bs = self._run, self.log, self.block_size
        step = self.step_index
        first_tokens = 0
        if undo.size:  # rows given the table-wide token that they did not get
            run[undo, KV : GEN + 1] -= 1
        if not isinstance(plan.chunk, list):
            return self._advance_many(plan)
        for row, tokens, done, new in zip(plan.prefill_rows.tolist(), plan.chunk, plan.completes, plan.new_tokens,
                                          strict=True):
            kv = int(run[row, KV]) - 1 + new
            run[row, KV] = kv
            run[row, PREFILL_LEFT] -= tokens
            if not done:
                run[row, GEN] -= 1
                continue
            first_tokens += 1
            self._phases[(kv - step - 1) % bs] += 1  # a decoding row from now on
            run[row, SEG] = step
            rid = int(run[row, REQ])
            log.state[rid] = State.DECODING
            if math.isnan(log.first_token_s[rid]):
                log.first_token_s[rid] = self.clock
            self.num_prefilling -= 1
            self._finish_countdown = min(self._finish_countdown, int(run[row, OUT] - run[row, GEN]))
        return first_tokens

    def _advance_many(self, plan: Plan) -> int:
        """:meth:`_advance_prefills` for a long head of chunks, in numpy."""
        run, log = self._run, self.log
        rows, chunk, done = plan.prefill_rows, plan.chunk, plan.completes
        run[rows, KV] += plan.new_tokens - 1
        run[rows, PREFILL_LEFT] -= chunk
        run[rows[~done], GEN] -= 1
        started = rows[done]
        if started.size:
            self._phases += np.bincount((run[started, KV] - self.step_index - 1) % self.block_size,
                                        minlength=self.block_size)
            run[started, SEG] = self.step_index
            ids = run[started, REQ]
            log.state[ids] = State.DECODING
            first = ids[np.isnan(log.first_token_s[ids])]
            log.first_token_s[first] = self.clock
            self.num_prefilling -= started.size
            left = int((run[started, OUT] - run[started, GEN]).min())
            self._finish_countdown = min(self._finish_countdown, left)
        return int(started.size)

    def _finish(self, rows: np.ndarray) -> None:
        run, log = self._run, self.log
        ids = run[rows, REQ]
        log.finish_s[ids] = self.clock
        log.state[ids] = State.FINISHED
        self.last_finished_ids = ids
        log.seg_req.extend(ids.tolist())
        log.seg_first.extend(run[rows, SEG].tolist())
        log.seg_last.extend([self.step_index] * rows.size)
        self.num_finished += rows.size
        self._remove_rows(rows)
        self.backend.release(ids)

    def _remove_rows(self, rows: np.ndarray) -> None:
        n, run, bs = self.num_running, self._run, self.block_size
        self.num_used_blocks -= int(num_blocks(run[rows, KV], bs).sum())
        self.token_load -= int((run[rows, HI] - run[rows, GEN]).sum())
        if rows.size == 1:  # the common case: shift the rows below up by one
            run[rows[0] : n - 1] = run[rows[0] + 1 : n]
        else:
            keep = np.ones(n, dtype=bool)
            keep[rows] = False
            run[: n - rows.size] = run[:n][keep]
        self.num_running = n - rows.size
        self._phases = None

    def _idle(self, next_arrival_s: float) -> None:
        """Nothing runs: wait for the model to load, poll for ``idle_tick_s`` while requests wait, or jump
        to the next arrival when the queue is empty."""
        if self.waiting.size and self.clock < self.ready_at:
            dt = self.ready_at - self.clock
        elif self.waiting.size:
            dt = self.idle_tick_s
        else:
            dt = max(0.0, next_arrival_s - self.clock) if math.isfinite(next_arrival_s) else 0.0
        self.clock += dt
        self.last_dt = dt
        self._num_prefill_seqs = 0
