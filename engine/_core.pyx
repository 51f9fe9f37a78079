# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The engine's iteration compiled: :class:`Core` is :class:`servegym.engine.engine.Engine`'s ``step`` (and
:class:`~servegym.engine.engine.EngineBase`'s ``receive``) over typed buffers, with the same results, plus
``observe``, the engine's part of an observation (tests compare both engines' episodes step by step).

``engine.py`` is the specification: read it for what an iteration does and why. This file keeps its structure
(admit, plan, preempt, execute, advance prefills, finish) and its names, and differs only in how: loops over the
running table and the log instead of numpy calls on small arrays, and the plan in fixed buffers. Only
:class:`servegym.engine.compiled.CompiledEngine` uses it; everything else that engine does is EngineBase's code.
Rare paths run EngineBase's own Python: preemption (``_evict``) and arrivals that can never fit.

C division is on (``cdivision``): every ``%`` below is over non-negative operands or goes through ``_mod``.
After editing this file, ``pip install -e .`` rebuilds it.
"""

import math

import numpy as np

from libc.math cimport isfinite, isnan

from servegym.backends.base import EMPTY, BatchTotals, StepBatch
from servegym.engine.engine import Col, EngineBase, StepOutcome
from servegym.engine.log import State, StepRow
from servegym.engine.preemption import pick_victims

# Running-table columns: Col's order in engine.py (checked below).
cdef enum:
    PROMPT = 0
    KV = 1
    GEN = 2
    LO = 3
    HI = 4
    PREFILL_LEFT = 5
    REQ = 6
    OUT = 7
    SEG = 8
    TARGET = 9
    NUM_COLS = 10

cdef signed char WAITING = State.WAITING
cdef signed char PREFILLING = State.PREFILLING
cdef signed char DECODING = State.DECODING
cdef signed char FINISHED = State.FINISHED
cdef signed char PREEMPTED = State.PREEMPTED
cdef long long NOT_DECODING = 1LL << 40
"""Added to a prefilling row's remaining tokens so that the finish countdown skips it (as in engine.py)."""

ENGINE_FEATURES = (
    "itl_last_s", "itl_smoothed_s", "baseline_step_s", "num_running", "num_prefilling", "token_load", "num_waiting",
    "kv_free_frac", "kv_free_delta", "kv_capacity_tokens", "kv_block_size", "last_num_preemptions",
    "last_num_admitted", "last_num_finished", "length_mode", "prefill_chunk_tokens", "max_num_batched_tokens",
)
"""The order :meth:`Core.observe` writes ``obs["engine"]`` in (observation.py checks it against its schema)."""
QUEUE_FEATURES = ("num_prompt_tokens", "wait_s", "wait_steps", "output_lo", "output_hi", "num_generated")
"""The order :meth:`Core.observe` writes a queue row in (checked the same way)."""
cdef enum:
    QUEUE_WIDTH = 6
    RUNNING_WIDTH = 6

if [int(c) for c in Col] != list(range(NUM_COLS)) or [c.name for c in Col] != [
    "NUM_PROMPT_TOKENS", "NUM_KV_TOKENS", "NUM_GENERATED", "OUTPUT_LO", "OUTPUT_HI", "NUM_PREFILL_LEFT",
    "REQUEST_ID", "NUM_OUTPUT_TOKENS", "SEGMENT_START", "PREFILL_TARGET",
]:
    raise ImportError("engine.Col changed: update the column enum of servegym.engine._core")


_STATE = (
    "config", "backend", "_run", "_phases", "last", "log", "waiting", "last_finished_ids", "container",
    "num_kv_blocks", "block_size", "waiting_version", "num_running", "num_prefilling", "num_used_blocks",
    "token_load", "num_arrived", "num_finished", "num_rejected", "step_index", "_num_prefill_seqs",
    "_finish_countdown", "idle_tick_s", "clock", "ready_at", "idle_since", "itl_last", "itl_smoothed",
    "kv_free_delta", "last_dt", "_kv_free_prev",
)
"""What :meth:`Core.__reduce__` saves: every field that lives between steps (the plan buffers are rebuilt by
each step), set back through the same setters that bind the typed views."""


def _empty(cls):
    """A bare instance of a :class:`Core` subclass, for unpickling and copying (``__setstate__`` fills it)."""
    return cls.__new__(cls)


cdef inline long long _mod(long long a, long long b) noexcept:
    """Python's ``a % b`` for ``b > 0``: never negative."""
    cdef long long r = a % b
    return r + b if r < 0 else r


cdef inline long long _blocks(long long tokens, long long bs) noexcept:
    """``num_blocks``: ceil(tokens / bs) for tokens >= 0."""
    return (tokens + bs - 1) // bs


cdef class Core:
    """Engine state in C fields (public: EngineBase's Python methods read and write them by name) and the
    compiled iteration. Not used alone: see :class:`servegym.engine.compiled.CompiledEngine`."""

    cdef public object waiting, last_finished_ids
    cdef public int container
    cdef public long long num_kv_blocks, block_size, waiting_version, num_running, num_prefilling
    cdef public long long num_used_blocks, token_load, num_arrived, num_finished, num_rejected, step_index
    cdef public long long _num_prefill_seqs, _finish_countdown
    cdef public double idle_tick_s, clock, ready_at, idle_since, itl_last, itl_smoothed, kv_free_delta, last_dt
    cdef public double _kv_free_prev
    # Bound by the setters of config, backend, _run, _phases and log.
    cdef object _config, _backend, _totals, _run_arr, _phases_arr, _log, _last
    cdef long long last_preempted, last_admitted, last_finished
    cdef long long[:, ::1] run
    cdef long long[::1] phases
    cdef bint phases_valid, check
    cdef long long max_num_seqs, max_batched, chunk_limit, max_prefill
    cdef double smoothing
    cdef object rule
    cdef const long long[::1] prompt, output, lo, hi
    cdef long long[::1] generated_at_preemption, enqueue_step
    cdef short[::1] container_of
    cdef const double[::1] arrival_s
    cdef signed char[::1] state
    cdef double[::1] admit_s, first_token_s, finish_s
    # This iteration's plan: prefilling rows in table order; the first num_chunks of them get chunk[i] tokens.
    cdef long long[::1] pre_rows, chunk, done, gone
    cdef object _plan_arr
    cdef Py_ssize_t num_chunks
    cdef bint planned

    def __reduce__(self):
        """Pickle and ``copy.deepcopy`` through the public fields (typed views cannot be pickled themselves). The
        fields travel as state, set after the copy is registered, so references back to the engine stay cycles."""
        return _empty, (type(self),), ([(name, getattr(self, name)) for name in _STATE],
                                       dict(getattr(self, "__dict__", {})))

    def __setstate__(self, state):
        fields, extra = state
        for name, value in fields:
            setattr(self, name, value)
        self.__dict__.update(extra)

    # ------------------------------------------------------------------ bindings
    @property
    def config(self):
        return self._config

    @config.setter
    def config(self, config):
        self._config = config
        self.max_num_seqs = config.max_num_seqs
        self.max_batched = config.max_num_batched_tokens
        self.chunk_limit = config.prefill_chunk_tokens
        self.max_prefill = -1 if config.max_prefill_tokens is None else config.max_prefill_tokens
        self.smoothing = config.itl_smoothing
        self.check = config.check_invariants
        self.rule = config.preemption

    @property
    def backend(self):
        return self._backend

    @backend.setter
    def backend(self, backend):
        self._backend = backend
        # Totals stand in for execute only where the class that defines execute also defines execute_totals: a
        # subclass that overrides execute alone must still be called.
        owner = next((c for c in type(backend).__mro__ if "execute" in vars(c)), None)
        self._totals = backend.execute_totals if owner is not None and "execute_totals" in vars(owner) else None

    @property
    def _run(self):
        return self._run_arr

    @_run.setter
    def _run(self, run):
        if run.shape[1] != NUM_COLS:
            raise ValueError(f"the running table needs {NUM_COLS} columns, got {run.shape[1]}")
        self._run_arr = run
        self.run = run
        # The plan's buffers hold one entry per table row.
        self._plan_arr = np.zeros((4, run.shape[0]), dtype=np.int64)
        self.pre_rows, self.chunk, self.done = self._plan_arr[0], self._plan_arr[1], self._plan_arr[2]
        self.gone = self._plan_arr[3]  # rows that leave the table this iteration, ascending

    @property
    def _phases(self):
        """Decode rows per block phase, or None when they are to be recounted (as in engine.py)."""
        return self._phases_arr if self.phases_valid else None

    @_phases.setter
    def _phases(self, phases):
        if phases is None:
            self.phases_valid = False
        else:
            self._phases_arr = np.ascontiguousarray(phases, dtype=np.int64)
            self.phases = self._phases_arr
            self.phases_valid = True

    @property
    def last(self):
        """What the last iteration did (a StepOutcome)."""
        return self._last

    @last.setter
    def last(self, outcome):
        self._last = outcome
        self.last_preempted = outcome.num_preemptions
        self.last_admitted = outcome.num_admitted
        self.last_finished = outcome.num_finished

    @property
    def log(self):
        return self._log

    @log.setter
    def log(self, log):
        self._log = log
        if log is None:
            return
        # The log's own arrays (RequestSpec makes the request columns int64; a mismatch is a ValueError here).
        self.prompt, self.output, self.lo, self.hi = (log.num_prompt_tokens, log.num_output_tokens, log.output_lo,
                                                      log.output_hi)
        self.generated_at_preemption = log.num_generated_at_preemption
        self.state = log.state
        self.admit_s = log.admit_s
        self.first_token_s = log.first_token_s
        self.finish_s = log.finish_s
        self.enqueue_step = log.enqueue_step
        self.container_of = log.container
        self.arrival_s = log.arrival_s

    # ------------------------------------------------------------------ step
    def step(self, admit, double next_arrival_s=math.inf):
        """See :meth:`servegym.engine.engine.Engine.step`."""
        if self._log is None:
            raise RuntimeError("the engine has no episode: call reset() first")
        cdef bint had_work = len(self.waiting) > 0 or self.num_running > 0
        cdef long long admitted = 0, refused = 0, preempted = 0, need = 0
        cdef long long decode_tokens = 0, prefill_tokens = 0, finished = 0
        if len(admit):
            admitted, refused = self._admit(admit)
        if self.num_running:
            need = self._plan()
            while need > self.num_kv_blocks - self.num_used_blocks:
                rows = self._run_arr[: self.num_running]
                preempted += self._evict(pick_victims(self.rule, rows[:, GEN], rows[:, LO], rows[:, HI]))
                need = self._plan()
        if self.num_running:
            decode_tokens, prefill_tokens, finished = self._execute(need)
        else:
            self._idle(next_arrival_s)
        if had_work and not (len(self.waiting) or self.num_running):
            self.idle_since = self.clock
        cdef double kv_free = 1.0 - <double>self.num_used_blocks / <double>self.num_kv_blocks
        self.kv_free_delta += self.smoothing * ((kv_free - self._kv_free_prev) - self.kv_free_delta)
        self._kv_free_prev = kv_free
        self._log.step_rows[self.container].append(StepRow(
            self.clock, self.last_dt, decode_tokens, self._num_prefill_seqs, prefill_tokens, self.num_running,
            len(self.waiting), self.num_used_blocks, admitted, preempted, finished,
        ))
        self.step_index += 1
        self._last = StepOutcome(self.last_dt, decode_tokens, prefill_tokens, admitted, refused, preempted, finished)
        self.last_preempted, self.last_admitted, self.last_finished = preempted, admitted, finished
        if self.check:
            self.check_invariants()
        return self._last

    def receive(self, ids, double now):
        """:meth:`EngineBase.receive`, with the per-request work in C (a batch with a request that can never fit
        goes through EngineBase's own code)."""
        if self._log is None:
            raise RuntimeError("the engine has no episode: call reset() first")
        if not -32768 <= self.container <= 32767:  # the log's container column is int16, as numpy would say
            raise OverflowError(f"container index {self.container} does not fit the log's int16 column")
        cdef const long long[::1] given = np.ascontiguousarray(ids, dtype=np.int64)
        cdef Py_ssize_t m = given.shape[0], k
        cdef long long capacity = self.num_kv_blocks * self.block_size, rid
        for k in range(m):
            rid = given[k]
            if not 0 <= rid < self.prompt.shape[0]:
                raise IndexError(f"request id {rid} out of range for an episode of {self.prompt.shape[0]}")
            if self.prompt[rid] + self.output[rid] > capacity:
                return EngineBase.receive(self, ids, now)
        if self.clock < now:  # the engine sat idle until now
            self.clock = now
        self.num_arrived += m
        for k in range(m):
            rid = given[k]
            self.container_of[rid] = self.container
            self.state[rid] = WAITING
            self.enqueue_step[rid] = self.step_index
        if m == 0:
            return 0, 0.0
        self.waiting = np.concatenate([self.waiting, ids])
        self.waiting_version += 1
        if m == 1:
            return 0, now - self.arrival_s[given[0]]
        return 0, float((now - self._log.arrival_s[ids]).sum())  # numpy's summation order, as EngineBase's

    def observe(self, float[::1] buf, Py_ssize_t pool_end, Py_ssize_t queue_end, Py_ssize_t window,
                double baseline, double capacity, double length_mode):
        """Write ``obs["engine"]`` (from 0), the first ``window`` queue rows (from ``pool_end``) and
        ``obs["running"]`` (from ``queue_end``) into a zeroed observation buffer: what
        :meth:`servegym.envs.observation.ObservationEncoder.encode` writes for a Python engine, value for value."""
        cdef Py_ssize_t i, j, k = min(len(self.waiting), window), n = self.num_running, at
        cdef long long rid
        cdef const long long[:] waiting
        cdef long long[:, ::1] run = self.run
        if not (len(ENGINE_FEATURES) <= pool_end <= queue_end and 0 <= window <= (queue_end - pool_end) // QUEUE_WIDTH
                and queue_end + self.run.shape[0] * RUNNING_WIDTH <= buf.shape[0]):
            raise ValueError(f"observation buffer of {buf.shape[0]} floats does not fit this layout")
        if k:
            waiting = self.waiting
            for i in range(k):
                rid = waiting[i]
                at = pool_end + i * QUEUE_WIDTH
                buf[at] = self.prompt[rid]
                buf[at + 1] = self.clock - self.arrival_s[rid]
                buf[at + 2] = self.step_index - self.enqueue_step[rid]
                buf[at + 3] = self.lo[rid]
                buf[at + 4] = self.hi[rid]
                buf[at + 5] = self.generated_at_preemption[rid]
        for i in range(n):
            for j in range(RUNNING_WIDTH):
                buf[queue_end + i * RUNNING_WIDTH + j] = run[i, j]
        buf[0] = self.itl_last
        buf[1] = self.itl_smoothed
        buf[2] = baseline
        buf[3] = n
        buf[4] = self.num_prefilling
        buf[5] = self.token_load
        buf[6] = len(self.waiting)
        buf[7] = 1.0 - <double>self.num_used_blocks / <double>self.num_kv_blocks
        buf[8] = self.kv_free_delta
        buf[9] = capacity
        buf[10] = self.block_size
        buf[11] = self.last_preempted
        buf[12] = self.last_admitted
        buf[13] = self.last_finished
        buf[14] = length_mode
        buf[15] = self.chunk_limit
        buf[16] = self.max_batched

    cdef tuple _admit(self, admit):
        given = np.asarray(admit)
        if given.dtype.kind not in "iu":
            raise IndexError(f"queue positions must be integers, got dtype {given.dtype}")
        cdef const long long[::1] positions = np.ascontiguousarray(given, dtype=np.int64)
        cdef Py_ssize_t count = positions.shape[0], k, taken = 0, largest = -1, pos
        if self.clock < self.ready_at:
            return 0, count
        cdef const long long[:] waiting = self.waiting
        cdef long long free = self.num_kv_blocks - self.num_used_blocks
        cdef long long rid, target, first, blocks, generated, r
        cdef long long[:, ::1] run = self.run
        for k in range(count):
            pos = positions[k]
            if not 0 <= pos < waiting.shape[0]:  # bounds are not checked below: say what the Python engine would
                raise IndexError(f"queue position {pos} out of range for a queue of {waiting.shape[0]}")
            rid = waiting[pos]
            generated = self.generated_at_preemption[rid]
            target = self.prompt[rid] + generated
            first = min(self.chunk_limit, target)
            blocks = _blocks(first + (first == target), self.block_size)
            if self.num_running >= self.max_num_seqs or blocks > free:
                break
            free -= blocks
            r = self.num_running
            if r >= run.shape[0]:  # a config reassigned to more sequences than the table holds
                raise IndexError(f"the running table holds {run.shape[0]} rows")
            run[r, PROMPT] = self.prompt[rid]
            run[r, KV] = 0
            run[r, GEN] = generated
            run[r, LO] = self.lo[rid]
            run[r, HI] = self.hi[rid]
            run[r, PREFILL_LEFT] = target
            run[r, REQ] = rid
            run[r, OUT] = self.output[rid]
            run[r, SEG] = -1
            run[r, TARGET] = target
            self.num_running += 1
            self.num_prefilling += 1
            self.token_load += self.hi[rid] - generated
            self.state[rid] = PREFILLING
            if isnan(self.admit_s[rid]):
                self.admit_s[rid] = self.clock
            taken += 1
            largest = max(largest, pos)
        if taken:
            # Distinct positions whose largest is taken - 1 are the queue's head (FCFS-like admission).
            if largest == taken - 1:
                self.waiting = self.waiting[taken:]
            else:
                self.waiting = np.delete(self.waiting, np.asarray(positions[:taken]))
            self.waiting_version += 1
        return taken, count - taken

    cdef long long _plan(self) except -1:
        """Decide this iteration's tokens (into the plan buffers); return the KV blocks they need."""
        cdef Py_ssize_t n = self.num_running, i, num_pre = 0
        cdef long long bs = self.block_size, step = self.step_index, need, budget, wanted, tokens, want, kv, rest
        cdef long long[:, ::1] run = self.run
        if not self.phases_valid:
            if self._phases_arr is None or self._phases_arr.shape[0] != bs:
                self._phases_arr = np.zeros(bs, dtype=np.int64)
                self.phases = self._phases_arr
            self.phases[:] = 0
            for i in range(n):
                if run[i, PREFILL_LEFT] == 0:
                    self.phases[_mod(run[i, KV] - step, bs)] += 1
            self.phases_valid = True
        need = self.phases[_mod(-step, bs)]
        self.num_chunks = 0
        self.planned = self.num_prefilling != 0
        if not self.planned:
            return need
        for i in range(n):
            if run[i, PREFILL_LEFT] != 0:
                self.pre_rows[num_pre] = i
                num_pre += 1
        budget = self.max_batched - (n - num_pre)
        if self.max_prefill >= 0:
            budget = min(budget, self.max_prefill)
        # Chunks in table order until the budget runs out: a row gets tokens if its chunk starts within it.
        wanted = 0
        for i in range(num_pre):
            if wanted >= budget:
                break
            rest = run[self.pre_rows[i], PREFILL_LEFT]
            want = min(rest, self.chunk_limit)
            tokens = min(budget - wanted, want)
            wanted += want
            self.chunk[i] = tokens
            self.done[i] = tokens == rest
            kv = run[self.pre_rows[i], KV]
            need += _blocks(kv + tokens + self.done[i], bs) - _blocks(kv, bs)
            self.num_chunks += 1
        return need

    cdef tuple _execute(self, long long need):
        cdef Py_ssize_t n = self.num_running, i, row
        cdef long long[:, ::1] run = self.run
        cdef long long decodes = 0, prefill_tokens = 0, completes = 0, start, kv, rid, step = self.step_index
        cdef long long bs = self.block_size
        cdef double context = 0.0, pairs = 0.0, dt
        for i in range(n):
            if run[i, PREFILL_LEFT] == 0:
                decodes += 1
                context += run[i, KV]
        for i in range(self.num_chunks):
            row = self.pre_rows[i]
            start = run[row, TARGET] - run[row, PREFILL_LEFT]
            prefill_tokens += self.chunk[i]
            pairs += self.chunk[i] * (start + (self.chunk[i] + 1) * 0.5)
            completes += self.done[i]
        self._num_prefill_seqs = self.num_chunks
        if self._totals is not None:
            latency = self._totals(BatchTotals(decodes, context, self.num_chunks, <double>prefill_tokens, pairs,
                                               completes))
        else:
            latency = self._backend.execute(self._batch())
        if not (latency > 0 and math.isfinite(latency)):
            raise RuntimeError(f"backend returned an invalid step latency {latency!r}")
        dt = latency
        self.clock += dt
        self.last_dt = dt
        cdef long long decode_tokens = decodes
        if decodes:
            self.itl_last = dt
            self.itl_smoothed += self.smoothing * (dt - self.itl_smoothed)
        self.num_used_blocks += need
        for i in range(n):
            if run[i, PREFILL_LEFT] == 0:
                run[i, KV] += 1
                run[i, GEN] += 1
        self._finish_countdown -= 1
        # Chunks: KV gains the chunk (and the first token when it completes the prefill).
        for i in range(self.num_chunks):
            row = self.pre_rows[i]
            kv = run[row, KV] + self.chunk[i] + self.done[i]
            run[row, KV] = kv
            run[row, PREFILL_LEFT] -= self.chunk[i]
            if not self.done[i]:
                continue
            run[row, GEN] += 1
            decode_tokens += 1
            self.phases[_mod(kv - step - 1, bs)] += 1  # a decoding row from now on
            run[row, SEG] = step
            rid = run[row, REQ]
            self.state[rid] = DECODING
            if isnan(self.first_token_s[rid]):
                self.first_token_s[rid] = self.clock
            self.num_prefilling -= 1
            self._finish_countdown = min(self._finish_countdown, run[row, OUT] - run[row, GEN])
        self.token_load -= decode_tokens
        if self._finish_countdown > 0:
            return decode_tokens, prefill_tokens, 0
        # Only decoding rows can finish; prefilling rows still have their output ahead of them.
        cdef long long finished = 0, left, rest
        for i in range(n):
            if run[i, OUT] == run[i, GEN]:
                self.gone[finished] = i
                finished += 1
        if finished:
            self._finish(finished)
        n = self.num_running
        left = 0
        for i in range(n):
            rest = run[i, OUT] - run[i, GEN] + run[i, PREFILL_LEFT] * NOT_DECODING
            left = rest if i == 0 else min(left, rest)
        self._finish_countdown = left
        return decode_tokens, prefill_tokens, finished

    cdef object _batch(self):
        """The iteration as a :class:`StepBatch` (for backends that run it, not only time it)."""
        run, n = self._run_arr, self.num_running
        rows = self._plan_arr[0, : self.num_chunks]
        decoding = run[:n, PREFILL_LEFT] == 0
        if not self.planned:
            return StepBatch(run[:n, REQ], run[:n, KV], EMPTY, EMPTY, EMPTY, EMPTY)
        target = run[rows, TARGET]
        return StepBatch(run[:n, REQ][decoding], run[:n, KV][decoding], run[rows, REQ],
                         target - run[rows, PREFILL_LEFT], self._plan_arr[1, : self.num_chunks].copy(), target)

    cdef _finish(self, Py_ssize_t count):
        """The first ``count`` rows of ``gone`` finished: stamp them in the log and drop them from the table."""
        cdef long long[:, ::1] run = self.run
        cdef Py_ssize_t k, row
        cdef long long rid
        log = self._log
        ids = np.empty(count, dtype=np.int64)
        cdef long long[::1] finished_ids = ids
        for k in range(count):
            row = self.gone[k]
            rid = run[row, REQ]
            finished_ids[k] = rid
            self.finish_s[rid] = self.clock
            self.state[rid] = FINISHED
            log.seg_req.append(rid)
            log.seg_first.append(run[row, SEG])
            log.seg_last.append(self.step_index)
        self.last_finished_ids = ids
        self.num_finished += count
        self._remove_gone(count)
        self._backend.release(ids)

    def _remove_rows(self, rows):
        """Drop ``rows`` from the table, keeping the others' order (EngineBase._evict calls it)."""
        cdef const long long[::1] given = np.unique(np.asarray(rows, dtype=np.int64))  # ascending, once each
        cdef Py_ssize_t k
        if given.shape[0] and not (given[0] >= 0 and given[given.shape[0] - 1] < self.num_running):
            raise IndexError(f"rows to remove must be running rows (0..{self.num_running - 1})")
        for k in range(given.shape[0]):
            self.gone[k] = given[k]
        self._remove_gone(given.shape[0])

    cdef _remove_gone(self, Py_ssize_t count):
        """Drop the first ``count`` rows of ``gone`` (ascending) from the table, keeping the others' order."""
        cdef long long[:, ::1] run = self.run
        cdef Py_ssize_t n = self.num_running, k = 0, i, j, kept = 0
        for i in range(n):
            if k < count and self.gone[k] == i:
                self.num_used_blocks -= _blocks(run[i, KV], self.block_size)
                self.token_load -= run[i, HI] - run[i, GEN]
                k += 1
                continue
            if kept != i:
                for j in range(NUM_COLS):
                    run[kept, j] = run[i, j]
            kept += 1
        self.num_running = kept
        self.phases_valid = False

    cdef _idle(self, double next_arrival_s):
        """Nothing runs: wait for the model to load, poll while requests wait, or jump to the next arrival."""
        cdef double dt
        if len(self.waiting) and self.clock < self.ready_at:
            dt = self.ready_at - self.clock
        elif len(self.waiting):
            dt = self.idle_tick_s
        else:
            dt = max(0.0, next_arrival_s - self.clock) if isfinite(next_arrival_s) else 0.0
        self.clock += dt
        self.last_dt = dt
        self._num_prefill_seqs = 0
