# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The serving engine: one call to :meth:`Engine.step` is one iteration (one forward pass).

One source, run two ways. ``pip install`` compiles this module with Cython's pure-Python mode (the ``cython.*``
annotations are C types), so an iteration is a few loops in C over the running table and the log; without a C
compiler the same file runs as Python. Both give the same episodes, float for float (``tests/test_compiled_engine.py``
runs them side by side; :func:`servegym.engine.compiled.engine_class` picks one).

Running requests live in a dense table (one int64 row per request, in activation order; :class:`Col`). An
iteration admits, plans (which rows get how many tokens, and the KV blocks that needs), preempts until the plan
fits, times the batch on the backend, advances every row and retires the finished ones.

The typed buffers are bound to ``memoryview`` objects, so the interpreted module reads plain ints and floats, as
the compiled one does. C division is on (``cdivision``): every ``%`` is over non-negative operands or goes through
:func:`_mod`. After editing this file, ``pip install -e .`` rebuilds it.
"""

import math

import cython
import numpy as np

from servegym.backends.base import EMPTY, Backend, BatchTotals, StepBatch
from servegym.engine.config import EngineConfig, Recompute
from servegym.engine.kv import num_blocks
from servegym.engine.log import EpisodeLog, RejectReason, State
from servegym.engine.preemption import pick_victims
from servegym.engine.prefix_cache import PrefixCache, cacheable_units
from servegym.engine.table import (
    ENGINE_FEATURES,
    IDLE,
    POOL_FEATURES,
    QUEUE_FEATURES,
    RUNNING_OBS_COLUMNS,
    Col,
    StepOutcome,
)

COMPILED: bool = cython.compiled
"""True where this module runs compiled."""

PROMPT = cython.declare(cython.Py_ssize_t, Col.NUM_PROMPT_TOKENS)
KV = cython.declare(cython.Py_ssize_t, Col.NUM_KV_TOKENS)
GEN = cython.declare(cython.Py_ssize_t, Col.NUM_GENERATED)
LO = cython.declare(cython.Py_ssize_t, Col.OUTPUT_LO)
HI = cython.declare(cython.Py_ssize_t, Col.OUTPUT_HI)
PREFILL_LEFT = cython.declare(cython.Py_ssize_t, Col.NUM_PREFILL_LEFT)
REQ = cython.declare(cython.Py_ssize_t, Col.REQUEST_ID)
OUT = cython.declare(cython.Py_ssize_t, Col.NUM_OUTPUT_TOKENS)
SEG = cython.declare(cython.Py_ssize_t, Col.SEGMENT_START)
TARGET = cython.declare(cython.Py_ssize_t, Col.PREFILL_TARGET)
NUM_COLS = cython.declare(cython.Py_ssize_t, len(Col))
NUM_OBS = cython.declare(cython.Py_ssize_t, len(RUNNING_OBS_COLUMNS))
"""Observable columns (``Col`` 0-5, :data:`~servegym.engine.table.RUNNING_OBS_COLUMNS`)."""
NUM_ENGINE = cython.declare(cython.Py_ssize_t, len(ENGINE_FEATURES))
"""``obs["engine"]`` features (:data:`~servegym.engine.table.ENGINE_FEATURES`)."""
QUEUE_WIDTH = cython.declare(cython.Py_ssize_t, len(QUEUE_FEATURES))
"""Features of a queue row (:data:`~servegym.engine.table.QUEUE_FEATURES`)."""
POOL_WIDTH = cython.declare(cython.Py_ssize_t, len(POOL_FEATURES))
"""Features of a container's row of ``obs["pool"]`` (:data:`~servegym.engine.table.POOL_FEATURES`)."""
WAITING = cython.declare(cython.schar, State.WAITING)
PREFILLING = cython.declare(cython.schar, State.PREFILLING)
DECODING = cython.declare(cython.schar, State.DECODING)
FINISHED = cython.declare(cython.schar, State.FINISHED)
PREEMPTED = cython.declare(cython.schar, State.PREEMPTED)
REJECTED = cython.declare(cython.schar, State.REJECTED)
NOT_DECODING = cython.declare(cython.longlong, 1 << 40)
"""Added to a prefilling row's remaining tokens so that the finish countdown skips it."""

_STATE = (
    "config", "backend", "_run", "_phases", "last", "log", "waiting", "last_finished_ids", "container",
    "num_kv_blocks", "block_size", "waiting_version", "num_running", "num_prefilling", "num_used_blocks",
    "token_load", "num_arrived", "num_finished", "num_rejected", "step_index", "_num_prefill_seqs",
    "_finish_countdown", "idle_tick_s", "clock", "ready_at", "idle_since", "itl_last", "itl_smoothed",
    "kv_free_delta", "last_dt", "_kv_free_prev", "prefix_cache", "host_load_s_per_token", "pending_load_s",
)
"""What :meth:`Engine.__reduce__` saves: every field that lives between steps (the plan buffers are rebuilt by
each step), set back through the setters that bind the typed buffers."""


def _host_load_s_per_token(config: EngineConfig, backend: Backend) -> float:
    """Seconds to copy one token's KV from host memory (0 without a host tier); an error where the backend states
    neither its KV bytes per token nor, without ``host_link_bytes_s``, its host link."""
    if config.prefix_caching and backend.owns_cache:
        raise ValueError("prefix caching is modelled by the calibrated backend only: the real backend's KV cache "
                         "holds each request's own tokens")
    if not config.host_kv_tokens:
        return 0.0
    kv_bytes = getattr(backend, "kv_bytes_per_token", None)
    link = config.host_link_bytes_s or getattr(backend, "host_link_bytes_s", None)
    if not kv_bytes or not link:
        raise ValueError("host_kv_tokens needs the backend's KV bytes per token and a host-link bandwidth (set "
                         "host_link_bytes_s); this backend states " + ("neither" if not kv_bytes else "no link"))
    return float(kv_bytes) / float(link)


def _empty(cls: type) -> object:
    """A bare instance of ``cls``, for unpickling and copying (``__setstate__`` fills it)."""
    return cls.__new__(cls)


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _mod(a: cython.longlong, b: cython.longlong) -> cython.longlong:
    """Python's ``a % b`` for ``b > 0``: never negative."""
    r: cython.longlong = a % b
    return r + b if r < 0 else r


@cython.ccall
def leading_run(chain: list, max_units: cython.longlong, refs: dict, tier: object) -> tuple:
    """``(GPU units, host units)`` in the longest leading run of ``chain``, at most ``max_units`` long, whose every
    unit is in ``refs`` (GPU memory) or ``tier`` (host memory): a prefix cache's match of a prompt, in time linear
    in the run's length (dictionary probes), whatever the cache's size."""
    gpu: cython.longlong = 0
    host: cython.longlong = 0
    for key in chain:
        if gpu + host >= max_units:
            break
        if key in refs:
            gpu += 1
        elif key in tier:
            host += 1
        else:
            break
    return gpu, host


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _blocks(tokens: cython.longlong, bs: cython.longlong) -> cython.longlong:
    """Blocks that hold ``tokens >= 0`` KV tokens: ceil(tokens / bs)."""
    return (tokens + bs - 1) // bs


@cython.cfunc
def _deleted(waiting: cython.const[cython.longlong][:], marks: cython.schar[::1], gone: cython.schar,
             count: cython.Py_ssize_t) -> object:
    """The queue without the ``count`` positions whose mark is ``gone``, in order (what ``np.delete`` returns, in
    one compiled pass: its Python wrapper cost more than the rest of an admission)."""
    k: cython.Py_ssize_t
    j: cython.Py_ssize_t = 0
    out = np.empty(waiting.shape[0] - count, dtype=np.int64)
    kept: cython.longlong[::1] = out
    for k in range(waiting.shape[0]):
        if marks[k] != gone:
            kept[j] = waiting[k]
            j += 1
    return out


@cython.cclass
class Engine:
    """One container's continuous-batching LLM serving engine over a paged KV cache.

    The engine serves the requests routed to it (:meth:`receive`); a :class:`~servegym.pool.Cluster` owns the
    workload, the routing and the event clock across containers, and picks the compiled or the interpreted class.

    Args:
        config: scheduler-independent engine settings.
        backend: times iterations (calibrated model or real model).
        container: this engine's index in its pool.
    """

    __dict__: dict  # instance attributes (a test's spy) beside the typed fields
    waiting = cython.declare(object, visibility="public")
    """Request ids waiting to be admitted, queue head first (preempted requests go to the front)."""
    last_finished_ids = cython.declare(object, visibility="public")
    """Ids that finished in the latest iteration that finished any (read it when ``last.num_finished > 0``)."""
    container = cython.declare(cython.int, visibility="public")
    num_kv_blocks = cython.declare(cython.longlong, visibility="public")
    block_size = cython.declare(cython.longlong, visibility="public")
    waiting_version = cython.declare(cython.longlong, visibility="public")
    """Bumped whenever ``waiting`` changes, so observers can cache what they derive from it."""
    num_running = cython.declare(cython.longlong, visibility="public")
    num_prefilling = cython.declare(cython.longlong, visibility="public")
    num_used_blocks = cython.declare(cython.longlong, visibility="public")
    token_load = cython.declare(cython.longlong, visibility="public")
    """Sum over running rows of ``output_hi - num_generated``: an upper bound on tokens still to emit."""
    num_arrived = cython.declare(cython.longlong, visibility="public")
    num_finished = cython.declare(cython.longlong, visibility="public")
    num_rejected = cython.declare(cython.longlong, visibility="public")
    step_index = cython.declare(cython.longlong, visibility="public")
    _num_prefill_seqs = cython.declare(cython.longlong, visibility="public")
    _finish_countdown = cython.declare(cython.longlong, visibility="public")
    """Iterations before any decoding request can finish (0: check now)."""
    idle_tick_s = cython.declare(cython.double, visibility="public")
    clock = cython.declare(cython.double, visibility="public")
    """This container's time (s): the end of its last iteration."""
    ready_at = cython.declare(cython.double, visibility="public")
    """When the model is loaded; nothing is admitted before (inf: cold, never loaded)."""
    idle_since = cython.declare(cython.double, visibility="public")
    itl_last = cython.declare(cython.double, visibility="public")
    itl_smoothed = cython.declare(cython.double, visibility="public")
    kv_free_delta = cython.declare(cython.double, visibility="public")
    """EMA of the per-step change of the free KV fraction (negative while the cache fills)."""
    last_dt = cython.declare(cython.double, visibility="public")
    _kv_free_prev = cython.declare(cython.double, visibility="public")
    last = cython.declare(object, visibility="public")
    """What the last iteration did (a :class:`~servegym.engine.table.StepOutcome`)."""
    prefix_cache = cython.declare(object, visibility="public")
    """The prefix cache (:class:`~servegym.engine.prefix_cache.PrefixCache`), or None with prefix caching off or a
    workload that shares no prefixes."""
    host_load_s_per_token = cython.declare(cython.double, visibility="public")
    """Seconds to copy one token's KV from the host tier to GPU memory."""
    pending_load_s = cython.declare(cython.double, visibility="public")
    """Host-tier copies of this iteration's admissions, charged to the iteration that runs next."""
    # Bound by the setters of config, backend, _run, _phases and log.
    _config: object
    _backend: object
    _totals: object
    _run_arr: object
    _phases_arr: object
    _log: object
    rule: object
    max_num_seqs: cython.longlong
    max_batched: cython.longlong
    chunk_limit: cython.longlong
    max_prefill: cython.longlong
    smoothing: cython.double
    check: cython.bint
    run: cython.longlong[:, ::1]
    phases: cython.longlong[::1]
    """Decoding rows per KV block phase ``(kv - step) mod block_size``; valid while ``phases_valid``."""
    phases_valid: cython.bint
    prompt: cython.const[cython.longlong][::1]
    output: cython.const[cython.longlong][::1]
    lo: cython.const[cython.longlong][::1]
    hi: cython.const[cython.longlong][::1]
    generated_at_preemption: cython.longlong[::1]
    enqueue_step: cython.longlong[::1]
    container_of: cython.short[::1]
    arrival_s: cython.const[cython.double][::1]
    state: cython.schar[::1]
    admit_s: cython.double[::1]
    first_token_s: cython.double[::1]
    finish_s: cython.double[::1]
    # This iteration's plan: prefilling rows in table order; the first num_chunks of them get chunk[i] tokens.
    _plan_arr: object
    pre_rows: cython.longlong[::1]
    chunk: cython.longlong[::1]
    done: cython.longlong[::1]
    gone: cython.longlong[::1]
    """Rows that leave the table this iteration, ascending."""
    num_chunks: cython.Py_ssize_t
    planned: cython.bint

    def __init__(self, config: EngineConfig, backend: Backend, container: int = 0) -> None:
        self.config = config
        self.backend = backend
        self.container = container
        self.num_kv_blocks = config.num_kv_blocks or backend.num_kv_blocks
        self.block_size = config.block_size or backend.block_size
        if backend.owns_cache and (self.num_kv_blocks, self.block_size) != (backend.num_kv_blocks,
                                                                            backend.block_size):
            raise ValueError(f"the backend's KV cache has {backend.num_kv_blocks} blocks of {backend.block_size} "
                             f"tokens; the engine config asks for {self.num_kv_blocks} of {self.block_size}")
        self.idle_tick_s = float(config.idle_tick_s or backend.baseline_step_s or 0.05)
        self.host_load_s_per_token = _host_load_s_per_token(config, backend)
        self._run = np.zeros((config.max_num_seqs, len(Col)), dtype=np.int64)
        self._phases_arr = None
        self.log = None
        self.last_finished_ids = np.zeros(0, dtype=np.int64)
        self._start(0.0, -math.inf)

    def __reduce__(self):
        """Pickle and ``copy.deepcopy`` through the fields (typed buffers cannot be pickled themselves). The fields
        travel as state, set after the copy is registered, so references back to the engine stay cycles. Instance
        attributes beyond the fields are not copied."""
        return _empty, (type(self),), [(name, getattr(self, name)) for name in _STATE]

    def __setstate__(self, fields: list[tuple[str, object]]) -> None:
        self._phases_arr = None
        for name, value in fields:
            setattr(self, name, value)

    # ------------------------------------------------------------------ episode
    def reset(self, log: EpisodeLog, rng: np.random.Generator, clock: float, ready_at: float = -math.inf) -> None:
        """Start an episode at ``clock`` with an empty queue; the model is loaded from ``ready_at`` on."""
        self.log = log
        self.backend.reset(rng)
        self._start(clock, ready_at)
        if self._config.prefix_caching and log.prefix is not None:
            self.prefix_cache = PrefixCache(log.prefix, self.block_size,
                                            self._config.host_kv_tokens // log.prefix.block_tokens,
                                            log.num_prompt_tokens)

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
        self.last = IDLE
        self._kv_free_prev = 1.0
        self._num_prefill_seqs = 0
        self._finish_countdown = 0
        self._phases = None
        self.prefix_cache = None
        self.pending_load_s = 0.0

    # ------------------------------------------------------------------ bindings
    @property
    def config(self) -> EngineConfig:
        return self._config

    @config.setter
    def config(self, config: EngineConfig) -> None:
        self._config = config
        self.max_num_seqs = config.max_num_seqs
        self.max_batched = config.max_num_batched_tokens
        self.chunk_limit = config.prefill_chunk_tokens
        self.max_prefill = -1 if config.max_prefill_tokens is None else config.max_prefill_tokens
        self.smoothing = config.itl_smoothing
        self.check = config.check_invariants
        self.rule = config.preemption

    @property
    def backend(self) -> Backend:
        return self._backend

    @backend.setter
    def backend(self, backend: Backend) -> None:
        self._backend = backend
        # Totals stand in for execute only where the class that defines execute also defines execute_totals: a
        # subclass that overrides execute alone must still be called.
        owner = next((c for c in type(backend).__mro__ if "execute" in vars(c)), None)
        self._totals = backend.execute_totals if owner is not None and "execute_totals" in vars(owner) else None

    @property
    def _run(self) -> np.ndarray:
        """The running table (``max_num_seqs`` rows of :class:`Col`; the first ``num_running`` are live)."""
        return self._run_arr

    @_run.setter
    def _run(self, run: np.ndarray) -> None:
        if run.shape[1] != NUM_COLS:
            raise ValueError(f"the running table needs {NUM_COLS} columns, got {run.shape[1]}")
        self._run_arr = run
        self.run = memoryview(run)
        self._plan_arr = np.zeros((4, run.shape[0]), dtype=np.int64)  # one entry per table row
        self.pre_rows, self.chunk = memoryview(self._plan_arr[0]), memoryview(self._plan_arr[1])
        self.done, self.gone = memoryview(self._plan_arr[2]), memoryview(self._plan_arr[3])

    @property
    def _phases(self) -> np.ndarray | None:
        """Decoding rows per block phase, or None when they are to be recounted."""
        return self._phases_arr if self.phases_valid else None

    @_phases.setter
    def _phases(self, phases: np.ndarray | None) -> None:
        if phases is None:
            self.phases_valid = False
            return
        self._phases_arr = np.ascontiguousarray(phases, dtype=np.int64)
        self.phases = memoryview(self._phases_arr)
        self.phases_valid = True

    @property
    def log(self) -> EpisodeLog | None:
        return self._log

    @log.setter
    def log(self, log: EpisodeLog | None) -> None:
        self._log = log
        if log is None:
            return
        # The log's own arrays (RequestSpec makes the request columns int64; a mismatch is a ValueError here).
        self.prompt, self.output = memoryview(log.num_prompt_tokens), memoryview(log.num_output_tokens)
        self.lo, self.hi = memoryview(log.output_lo), memoryview(log.output_hi)
        self.generated_at_preemption = memoryview(log.num_generated_at_preemption)
        self.state = memoryview(log.state)
        self.admit_s = memoryview(log.admit_s)
        self.first_token_s = memoryview(log.first_token_s)
        self.finish_s = memoryview(log.finish_s)
        self.enqueue_step = memoryview(log.enqueue_step)
        self.container_of = memoryview(log.container)
        self.arrival_s = memoryview(log.arrival_s)

    # ------------------------------------------------------------------ views
    @property
    def has_work(self) -> bool:
        return len(self.waiting) > 0 or self.num_running > 0

    # The pool's scans over its containers, once per iteration of a pool of several: here, in one pass over the
    # engines' typed fields (a pool of 8 in Python spent a fifth of an iteration on them).
    @staticmethod
    def earliest(engines: list) -> tuple:
        """(container, clock, has work) of the container that decides next: the earliest clock among the engines
        with work (:attr:`has_work`), else among all, the lowest index on ties."""
        e: Engine
        i: cython.Py_ssize_t
        busy: cython.bint
        best: cython.int = 0
        best_clock: cython.double = math.inf
        best_busy: cython.bint = False
        for i in range(len(engines)):
            e = engines[i]
            busy = len(e.waiting) > 0 or e.num_running > 0
            if (busy and not best_busy) or (busy == best_busy and e.clock < best_clock):
                best, best_clock, best_busy = e.container, e.clock, busy
        return best, best_clock, best_busy

    @cython.ccall
    def is_cold(self, now: cython.double, keep_alive_s: cython.double) -> cython.bint:
        """Cold at time ``now``: never loaded (``ready_at`` is inf), or idle with nothing to do for longer than
        ``keep_alive_s`` (inf: kept alive for ever) and not loading."""
        if self.ready_at == math.inf:
            return True
        return not (len(self.waiting) > 0 or self.num_running > 0) and now - self.idle_since > keep_alive_s

    @staticmethod
    def observe_pool(engines: list, deciding: cython.int, now: cython.double, keep_alive_s: cython.double,
                     out: cython.float[::1]) -> cython.longlong:
        """Write ``obs["pool"]``, one row of :data:`~servegym.engine.table.POOL_FEATURES` per engine in order, into
        ``out`` (at least ``POOL_WIDTH`` values per engine): 1 for the container ``deciding``; warmth 1, 0 when
        cold (:meth:`is_cold`), minus the seconds left while the model loads; seconds idle (0 while busy); waiting;
        running; free KV fraction. Returns the engines' finished requests, summed."""
        e: Engine
        i: cython.Py_ssize_t
        row: cython.Py_ssize_t
        warmth: cython.double
        finished: cython.longlong = 0
        if out.shape[0] < len(engines) * POOL_WIDTH:
            raise ValueError(f"out holds {out.shape[0]} values, {len(engines) * POOL_WIDTH} needed")
        for i in range(len(engines)):
            e = engines[i]
            row = i * POOL_WIDTH
            if e.is_cold(now, keep_alive_s):
                warmth = 0.0
            elif e.ready_at <= now:
                warmth = 1.0
            else:  # loading
                warmth = now - e.ready_at
            out[row] = 1.0 if e.container == deciding else 0.0
            out[row + 1] = warmth
            out[row + 2] = 0.0 if len(e.waiting) > 0 or e.num_running > 0 else now - e.idle_since
            out[row + 3] = len(e.waiting)
            out[row + 4] = e.num_running
            out[row + 5] = 1.0 - cython.cast(cython.double, e.num_used_blocks) / e.num_kv_blocks
            finished += e.num_finished
        return finished

    @staticmethod
    def stalled(engines: list, now: cython.double) -> cython.bint:
        """Requests wait in some engine while none runs anything or loads its model at time ``now``."""
        e: Engine
        i: cython.Py_ssize_t
        waiting: cython.bint = False
        for i in range(len(engines)):
            e = engines[i]
            if e.num_running > 0 or now < e.ready_at < math.inf:
                return False
            waiting = waiting or len(e.waiting) > 0
        return waiting

    @cython.boundscheck(True)  # ``order`` comes from the caller
    def admit_order(self, action: cython.const[cython.longlong][::1], window: cython.Py_ssize_t,
                    order: cython.longlong[::1]) -> tuple:
        """An admission action over the queue's first ``window`` slots decoded into the positions :meth:`step`
        admits (``ServingEnv`` documents the action): the visible slots (the first ``min(len(waiting), window)``)
        with a nonzero value, lowest value first and equal values in slot order, written to ``order``.

        Returns ``(count, beyond)``: how many were written and how many nonzero slots lie past the visible ones;
        ``(-1, 0)`` when a value lies outside ``[0, len(action)]``.
        """
        width: cython.Py_ssize_t = action.shape[0]
        visible: cython.Py_ssize_t = min(len(self.waiting), window)
        count: cython.Py_ssize_t = 0
        beyond: cython.Py_ssize_t = 0
        k: cython.Py_ssize_t
        j: cython.Py_ssize_t
        value: cython.longlong
        for k in range(width):
            value = action[k]
            if value == 0:
                continue
            if value < 0 or value > width:
                return -1, 0
            if k >= visible:
                beyond += 1
                continue
            j = count  # insertion sort, stable: a slot passes only the strictly higher values
            while j > 0 and action[order[j - 1]] > value:
                order[j] = order[j - 1]
                j -= 1
            order[j] = k
            count += 1
        return count, beyond

    @property
    def running(self) -> np.ndarray:
        """The observable columns of the running table (rows in activation order), as a copy."""
        return self._run_arr[: self.num_running, :NUM_OBS].copy()

    @property
    def running_ids(self) -> np.ndarray:
        """Request ids of the running rows, in activation order (oldest first)."""
        return self._run_arr[: self.num_running, REQ].copy()

    # ------------------------------------------------------------------ arrivals
    def receive(self, ids: np.ndarray, now: cython.double) -> tuple[int, float]:
        """Queue requests routed here at time ``now``; reject those that could never fit in the KV cache.

        Returns the number rejected and the summed lag ``now - arrival`` of the accepted ones.
        """
        if self._log is None:
            raise RuntimeError("the engine has no episode: call reset() first")
        if not -32768 <= self.container <= 32767:  # the log's container column is int16, as numpy would say
            raise OverflowError(f"container index {self.container} does not fit the log's int16 column")
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        given: cython.const[cython.longlong][::1] = memoryview(ids)
        m: cython.Py_ssize_t = given.shape[0]
        k: cython.Py_ssize_t
        rejected: cython.Py_ssize_t = 0
        capacity: cython.longlong = self.num_kv_blocks * self.block_size
        rid: cython.longlong
        for k in range(m):
            rid = given[k]
            if not 0 <= rid < self.prompt.shape[0]:
                raise IndexError(f"request id {rid} out of range for an episode of {self.prompt.shape[0]}")
        if self.clock < now:  # the engine sat idle until now
            self.clock = now
        self.num_arrived += m
        for k in range(m):
            rid = given[k]
            self.container_of[rid] = self.container
            if self.prompt[rid] + self.output[rid] > capacity:  # it could never finish
                self.state[rid] = REJECTED
                self._log.reject_reason[rid] = RejectReason.EXCEEDS_KV_CAPACITY
                self.finish_s[rid] = self.arrival_s[rid]
                rejected += 1
            else:
                self.state[rid] = WAITING
                self.enqueue_step[rid] = self.step_index
        self.num_rejected += rejected
        if rejected:
            ids = ids[self._log.state[ids] == State.WAITING]
        if m == rejected:
            return rejected, 0.0
        self.waiting = np.concatenate([self.waiting, ids])
        self.waiting_version += 1
        if m == 1:
            return 0, now - self.arrival_s[given[0]]
        return rejected, float((now - self._log.arrival_s[ids]).sum())  # numpy's summation order

    # ------------------------------------------------------------------ step
    def step(self, admit: np.ndarray, next_arrival_s: cython.double = math.inf) -> StepOutcome:
        """Run one iteration.

        Args:
            admit: queue positions to admit, in admission order (distinct, each in ``[0, len(queue))``; an
                ``IndexError`` otherwise, raised before anything changes). Admission stops at the first request
                that does not fit (``max_num_seqs`` or free KV blocks for its first chunk); it and the rest stay
                waiting (counted as ``refused``).
                Nothing is admitted while the model is still loading (``clock < ready_at``).
            next_arrival_s: when the next request reaches the pool; an engine with nothing to do jumps there.
        """
        if self._log is None:
            raise RuntimeError("the engine has no episode: call reset() first")
        had_work: cython.bint = len(self.waiting) > 0 or self.num_running > 0
        admitted: cython.longlong = 0
        refused: cython.longlong = 0
        preempted: cython.longlong = 0
        need: cython.longlong = 0
        decode_tokens: cython.longlong = 0
        prefill_tokens: cython.longlong = 0
        finished: cython.longlong = 0
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
        kv_free: cython.double = 1.0 - cython.cast(cython.double, self.num_used_blocks) / self.num_kv_blocks
        self.kv_free_delta += self.smoothing * ((kv_free - self._kv_free_prev) - self.kv_free_delta)
        self._kv_free_prev = kv_free
        self._log.step_rows[self.container].append((
            self.clock, self.last_dt, decode_tokens, self._num_prefill_seqs, prefill_tokens, self.num_running,
            len(self.waiting), self.num_used_blocks, admitted, preempted, finished))
        self.step_index += 1
        self.last = tuple.__new__(StepOutcome, (self.last_dt, decode_tokens, prefill_tokens, admitted, refused,
                                                preempted, finished))
        if self.check:
            self.check_invariants()
        return self.last

    def can_admit(self) -> bool:
        """Could an admission succeed now: requests wait, the model is loaded, and a sequence slot and a KV block
        are free."""
        return len(self.waiting) > 0 and self.clock >= self.ready_at and self.num_running < self.max_num_seqs \
            and self.num_used_blocks < self.num_kv_blocks

    def skip(self, next_arrival_s: cython.double, limit: cython.longlong) -> tuple[list, list]:
        """Run iterations that admit nothing while rows run, nothing arrives (``clock < next_arrival_s``) and
        nothing can be admitted, at most ``limit``, without returning to the caller between them.

        Returns each one's :class:`StepOutcome` and, for each that finished requests, ``(its index, their ids)``.
        """
        count: cython.longlong = 0
        outcomes, finished = [], []
        while count < limit and self.num_running and self.clock < next_arrival_s and not self.can_admit():
            outcomes.append(self.step(EMPTY, next_arrival_s))
            if self.last.num_finished:
                finished.append((count, self.last_finished_ids))
            count += 1
        return outcomes, finished

    @cython.cfunc
    def _admit(self, admit) -> tuple:
        """Admit the queue positions ``admit`` in order until one does not fit; return (admitted, refused)."""
        given = np.asarray(admit)
        if given.dtype.kind not in "iu":
            raise IndexError(f"queue positions must be integers, got dtype {given.dtype}")
        positions: cython.const[cython.longlong][::1] = memoryview(np.ascontiguousarray(given, dtype=np.int64))
        count: cython.Py_ssize_t = positions.shape[0]
        k: cython.Py_ssize_t
        taken: cython.Py_ssize_t = 0
        largest: cython.Py_ssize_t = -1
        pos: cython.Py_ssize_t
        waiting: cython.const[cython.longlong][:] = memoryview(self.waiting)
        # Checked before anything changes (the loops below skip bounds checks): in range, each given once.
        given_marks = np.zeros(waiting.shape[0], dtype=np.int8)
        marks: cython.schar[::1] = given_marks
        for k in range(count):
            pos = positions[k]
            if not 0 <= pos < waiting.shape[0]:
                raise IndexError(f"queue position {pos} out of range for a queue of {waiting.shape[0]}")
            if marks[pos]:
                raise IndexError(f"queue position {pos} given twice: the positions to admit must be distinct")
            marks[pos] = 1
        if self.clock < self.ready_at:
            return 0, count
        free: cython.longlong = self.num_kv_blocks - self.num_used_blocks
        rid: cython.longlong
        target: cython.longlong
        first: cython.longlong
        blocks: cython.longlong
        generated: cython.longlong
        r: cython.longlong
        run: cython.longlong[:, ::1] = self.run
        cache = self.prefix_cache
        hit: cython.longlong = 0
        for k in range(count):
            pos = positions[k]
            rid = waiting[pos]
            generated = self.generated_at_preemption[rid]
            target = self.prompt[rid] + generated
            if cache is not None:
                hit, blocks = self._match(rid, target)
            else:
                # The first iteration holds the first chunk, plus the sampled token when that chunk is the whole
                # prefill.
                first = min(self.chunk_limit, target)
                blocks = _blocks(first + (1 if first == target else 0), self.block_size)
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
            if cache is not None:
                self._acquire(rid, r, hit)
            run[r, REQ] = rid
            run[r, OUT] = self.output[rid]
            run[r, SEG] = -1
            run[r, TARGET] = target
            self.num_running += 1
            self.num_prefilling += 1
            self.token_load += self.hi[rid] - generated
            self.state[rid] = PREFILLING
            if self.admit_s[rid] != self.admit_s[rid]:  # NaN: first admission
                self.admit_s[rid] = self.clock
            taken += 1
            largest = max(largest, pos)
        if taken:
            # Distinct positions whose largest is taken - 1 are the queue's head (FCFS-like admission).
            if largest == taken - 1:
                self.waiting = self.waiting[taken:]
            else:
                for k in range(taken):
                    marks[positions[k]] = 2
                self.waiting = _deleted(waiting, marks, 2, taken)
            self.waiting_version += 1
        return taken, count - taken

    @cython.cfunc
    @cython.exceptval(-1)
    def _plan(self) -> cython.longlong:
        """Decide this iteration's tokens (into the plan buffers); return the KV blocks they need.

        A decoding row needs a new block when its KV count is a multiple of the block size. Decoding rows gain one
        token per iteration, so counting them by ``(KV - step) mod block_size`` makes that count a lookup, kept as
        rows start decoding and recounted only after rows leave. Prefilling rows get chunks in table order until
        the token budget runs out: a row gets tokens if its chunk starts within the budget.
        """
        n: cython.Py_ssize_t = self.num_running
        i: cython.Py_ssize_t
        num_pre: cython.Py_ssize_t = 0
        bs: cython.longlong = self.block_size
        step: cython.longlong = self.step_index
        need: cython.longlong
        budget: cython.longlong
        wanted: cython.longlong = 0
        tokens: cython.longlong
        want: cython.longlong
        kv: cython.longlong
        rest: cython.longlong
        run: cython.longlong[:, ::1] = self.run
        phases: cython.longlong[::1]
        if not self.phases_valid:
            if self._phases_arr is None or self._phases_arr.shape[0] != bs:
                self._phases_arr = np.zeros(bs, dtype=np.int64)
                self.phases = memoryview(self._phases_arr)
            phases = self.phases
            for i in range(bs):
                phases[i] = 0
            for i in range(n):
                if run[i, PREFILL_LEFT] == 0:
                    phases[_mod(run[i, KV] - step, bs)] += 1
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
        for i in range(num_pre):
            if wanted >= budget:
                break
            rest = run[self.pre_rows[i], PREFILL_LEFT]
            want = min(rest, self.chunk_limit)
            tokens = min(budget - wanted, want)
            wanted += want
            self.chunk[i] = tokens
            self.done[i] = 1 if tokens == rest else 0
            kv = run[self.pre_rows[i], KV]
            need += _blocks(kv + tokens + self.done[i], bs) - _blocks(kv, bs)
            self.num_chunks += 1
        return need

    @cython.cfunc
    def _execute(self, need: cython.longlong) -> tuple:
        """Time the planned batch and advance every row; return (decode tokens, prefill tokens, finished)."""
        n: cython.Py_ssize_t = self.num_running
        i: cython.Py_ssize_t
        row: cython.Py_ssize_t
        run: cython.longlong[:, ::1] = self.run
        decodes: cython.longlong = 0
        prefill_tokens: cython.longlong = 0
        completes: cython.longlong = 0
        start: cython.longlong
        kv: cython.longlong
        rid: cython.longlong
        step: cython.longlong = self.step_index
        bs: cython.longlong = self.block_size
        context: cython.double = 0.0
        pairs: cython.double = 0.0
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
            latency = self._totals(tuple.__new__(BatchTotals, (decodes, context, self.num_chunks,
                                                               float(prefill_tokens), pairs, completes)))
        else:
            latency = self._backend.execute(self._batch())
        if not (latency > 0 and math.isfinite(latency)):
            raise RuntimeError(f"backend returned an invalid step latency {latency!r}")
        dt: cython.double = float(latency)  # a numpy float32 must not turn the clock into float32
        if self.pending_load_s:
            dt += self.pending_load_s
            self.pending_load_s = 0.0
        self.clock += dt
        self.last_dt = dt
        decode_tokens: cython.longlong = decodes
        if decodes:
            self.itl_last = dt
            self.itl_smoothed += self.smoothing * (dt - self.itl_smoothed)
        self.num_used_blocks += need
        if self.prefix_cache is not None:
            self._reclaim()
        for i in range(n):
            if run[i, PREFILL_LEFT] == 0:
                run[i, KV] += 1
                run[i, GEN] += 1
        self._finish_countdown -= 1
        # Chunks: KV gains the chunk, and the first token when the chunk completes the prefill; the row then
        # decodes, and the finish countdown covers it (it may finish at once, when that token was its last).
        for i in range(self.num_chunks):
            row = self.pre_rows[i]
            kv = run[row, KV] + self.chunk[i] + self.done[i]
            run[row, KV] = kv
            run[row, PREFILL_LEFT] -= self.chunk[i]
            if self.prefix_cache is not None:
                self.prefix_cache.register(run[row, REQ], min(kv, run[row, PROMPT]))
            if not self.done[i]:
                continue
            run[row, GEN] += 1
            decode_tokens += 1
            self.phases[_mod(kv - step - 1, bs)] += 1
            run[row, SEG] = step
            rid = run[row, REQ]
            self.state[rid] = DECODING
            if self.first_token_s[rid] != self.first_token_s[rid]:  # NaN: its first token ever
                self.first_token_s[rid] = self.clock
            self.num_prefilling -= 1
            self._finish_countdown = min(self._finish_countdown, run[row, OUT] - run[row, GEN])
        self.token_load -= decode_tokens
        if self._finish_countdown > 0:
            return decode_tokens, prefill_tokens, 0
        # Only decoding rows can finish; prefilling rows still have their output ahead of them.
        finished: cython.longlong = 0
        left: cython.longlong = 0
        rest: cython.longlong
        for i in range(n):
            if run[i, OUT] == run[i, GEN]:
                self.gone[finished] = i
                finished += 1
        if finished:
            self._finish(finished)
        n = self.num_running
        for i in range(n):
            rest = run[i, OUT] - run[i, GEN] + run[i, PREFILL_LEFT] * NOT_DECODING
            left = rest if i == 0 else min(left, rest)
        self._finish_countdown = left
        return decode_tokens, prefill_tokens, finished

    @cython.cfunc
    def _batch(self) -> object:
        """The iteration as a :class:`StepBatch` (for backends that run it, not only time it)."""
        run, n = self._run_arr, self.num_running
        if not self.planned:
            return StepBatch(run[:n, REQ], run[:n, KV], EMPTY, EMPTY, EMPTY, EMPTY)
        rows = self._plan_arr[0, : self.num_chunks]
        decoding = run[:n, PREFILL_LEFT] == 0
        target = run[rows, TARGET]
        return StepBatch(run[:n, REQ][decoding], run[:n, KV][decoding], run[rows, REQ],
                         target - run[rows, PREFILL_LEFT], self._plan_arr[1, : self.num_chunks].copy(), target)

    @cython.cfunc
    def _finish(self, count: cython.Py_ssize_t) -> None:
        """The first ``count`` rows of ``gone`` finished: stamp them in the log and drop them from the table."""
        run: cython.longlong[:, ::1] = self.run
        k: cython.Py_ssize_t
        row: cython.Py_ssize_t
        rid: cython.longlong
        log = self._log
        ids = np.empty(count, dtype=np.int64)
        finished_ids: cython.longlong[::1] = memoryview(ids)
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

    # ------------------------------------------------------------------ prefix caching
    def _match(self, rid: cython.longlong, target: cython.longlong) -> tuple:
        """``(cached units, new blocks)`` of admitting ``rid`` now: the longest cached run of its chain (whole
        units only, never the last token to ingest), and the blocks its admission takes: free cached units it
        revives, units copied in from the host tier, and its first chunk's own blocks."""
        cache = self.prefix_cache
        unit: cython.longlong = cache.unit_tokens
        gpu, host = leading_run(cache.chain(rid), cacheable_units(self.prompt[rid], target, unit), cache.refs,
                                cache.host)
        hit: cython.longlong = gpu + host
        cached: cython.longlong = hit * unit
        first: cython.longlong = min(self.chunk_limit, target - cached)
        own: cython.longlong = _blocks(cached + first + (1 if cached + first == target else 0),
                                       self.block_size) - hit * cache.unit_blocks
        revive: cython.longlong = 0
        if gpu:
            for key in cache.chain(rid)[:gpu]:
                if cache.refs[key] == 0:
                    revive += 1
        return hit, own + (revive + host) * cache.unit_blocks

    def _acquire(self, rid: cython.longlong, row: cython.Py_ssize_t, hit: cython.longlong) -> None:
        """Start the admitted row ``row`` after its ``hit`` cached units: reference them, count the blocks they
        take back into use, and charge host-tier copies to the next iteration."""
        cache = self.prefix_cache
        cached: cython.longlong = hit * cache.unit_tokens
        revived, loaded = cache.acquire(rid, hit)
        self.num_used_blocks += (revived + loaded) * cache.unit_blocks
        if loaded:
            self.pending_load_s += loaded * cache.unit_tokens * self.host_load_s_per_token
            self._reclaim()
        self.run[row, KV] = cached
        self.run[row, PREFILL_LEFT] -= cached
        if self.admit_s[rid] != self.admit_s[rid]:  # NaN: its first admission is the one the hit ratio counts
            self._log.cached_gpu_tokens[rid] = (hit - loaded) * cache.unit_tokens
            self._log.cached_host_tokens[rid] = loaded * cache.unit_tokens

    def _reclaim(self) -> None:
        """Evict free cached units (least recently used first) until blocks in use plus cached fit the cache."""
        cache = self.prefix_cache
        excess: cython.longlong = self.num_used_blocks + len(cache.free) * cache.unit_blocks - self.num_kv_blocks
        if excess > 0:
            cache.evict(_blocks(excess, cache.unit_blocks))

    @property
    def cached_free_blocks(self) -> int:
        """Blocks that hold cached prefixes no running request references (reusable, and evictable on demand)."""
        return 0 if self.prefix_cache is None else len(self.prefix_cache.free) * self.prefix_cache.unit_blocks

    def queue_cached_tokens(self, window: cython.Py_ssize_t, out: cython.float[::1]) -> None:
        """:meth:`cached_prompt_tokens` of the first ``window`` queued requests, as ``(GPU, host)`` pairs into
        ``out`` (zeros are left where nothing is cached or prefix caching is off)."""
        cache = self.prefix_cache
        if cache is None or not len(self.waiting):
            return
        waiting: cython.const[cython.longlong][:] = memoryview(self.waiting)
        k: cython.Py_ssize_t = min(waiting.shape[0], window)
        i: cython.Py_ssize_t
        rid: cython.longlong
        cap: cython.longlong
        unit: cython.longlong = cache.unit_tokens
        chains, fresh, resumed = cache.caps()
        refs, tier = cache.refs, cache.host
        for i in range(k):
            rid = waiting[i]
            cap = resumed[rid] if self.generated_at_preemption[rid] else fresh[rid]
            gpu, host = leading_run(chains[rid], cap, refs, tier)
            out[2 * i] = gpu * unit
            out[2 * i + 1] = host * unit

    def cached_prompt_tokens(self, rid: int) -> tuple[int, int]:
        """``(GPU, host)`` prompt tokens of queued request ``rid`` that admitting it now would find cached."""
        cache = self.prefix_cache
        if cache is None:
            return 0, 0
        target = self.prompt[rid] + self.generated_at_preemption[rid]
        gpu, host = leading_run(cache.chain(rid), cacheable_units(self.prompt[rid], target, cache.unit_tokens),
                                cache.refs, cache.host)
        return gpu * cache.unit_tokens, host * cache.unit_tokens

    # ------------------------------------------------------------------ preemption
    def _evict(self, rows: np.ndarray) -> int:
        """Preempt ``rows`` (distinct running rows, in the order given) by recompute: free their blocks and put them
        at the queue front, in that order. Under ``recompute="restart"`` they lose their generated tokens and start
        again from the prompt. Rows are checked before anything changes."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if rows.shape[0] == 1:  # every rule but clear-all: one row, nothing to sort or compare
            ascending, duplicated = rows, False
        else:
            ascending = np.sort(rows)  # not np.unique, whose first call imports numpy.ma (8 ms)
            duplicated = (ascending[1:] == ascending[:-1]).any()
        if duplicated or (rows.size and not 0 <= ascending[0] <= ascending[-1] < self.num_running):
            raise IndexError(f"rows to evict must be distinct running rows (0..{self.num_running - 1}), got {rows}")
        victims: cython.const[cython.longlong][::1] = memoryview(rows)
        ordered: cython.const[cython.longlong][::1] = memoryview(ascending)
        count: cython.Py_ssize_t = victims.shape[0]
        k: cython.Py_ssize_t
        row: cython.Py_ssize_t
        rid: cython.longlong
        keep: cython.bint = self._config.recompute is Recompute.KEEP_OUTPUT
        run: cython.longlong[:, ::1] = self.run
        preemptions: cython.int[::1] = memoryview(self._log.num_preemptions)
        ids = np.empty(count, dtype=np.int64)
        evicted: cython.longlong[::1] = memoryview(ids)
        log = self._log
        for k in range(count):
            row = victims[k]
            self.gone[k] = ordered[k]
            rid = run[row, REQ]
            evicted[k] = rid
            self.state[rid] = PREEMPTED
            self.generated_at_preemption[rid] = run[row, GEN] if keep else 0
            preemptions[rid] += 1
            if run[row, SEG] >= 0:  # its decode segment ends with the previous iteration
                log.seg_req.append(rid)
                log.seg_first.append(run[row, SEG])
                log.seg_last.append(self.step_index - 1)
            if run[row, PREFILL_LEFT] != 0:
                self.num_prefilling -= 1
        self._remove_gone(count)
        self.waiting = np.concatenate([ids, self.waiting])
        self.waiting_version += 1
        self._backend.release(ids)
        return count

    @cython.cfunc
    def _remove_gone(self, count: cython.Py_ssize_t) -> None:
        """Drop the first ``count`` rows of ``gone`` (ascending) from the table, keeping the others' order."""
        run: cython.longlong[:, ::1] = self.run
        n: cython.Py_ssize_t = self.num_running
        k: cython.Py_ssize_t = 0
        i: cython.Py_ssize_t
        j: cython.Py_ssize_t
        kept: cython.Py_ssize_t = 0
        cache = self.prefix_cache
        for i in range(n):
            if k < count and self.gone[k] == i:
                self.num_used_blocks -= _blocks(run[i, KV], self.block_size)
                if cache is not None:  # its shared units were counted once, as held units; now some may be free
                    self.num_used_blocks += cache.held_units(run[i, REQ]) * cache.unit_blocks
                    self.num_used_blocks -= cache.release(run[i, REQ]) * cache.unit_blocks
                self.token_load -= run[i, HI] - run[i, GEN]
                k += 1
                continue
            if kept != i:
                for j in range(NUM_COLS):
                    run[kept, j] = run[i, j]
            kept += 1
        self.num_running = kept
        self.phases_valid = False

    @cython.cfunc
    def _idle(self, next_arrival_s: cython.double) -> None:
        """Nothing runs: wait for the model to load, poll for ``idle_tick_s`` while requests wait, or jump to the
        next arrival when the queue is empty."""
        dt: cython.double
        if len(self.waiting) and self.clock < self.ready_at:
            dt = self.ready_at - self.clock
        elif len(self.waiting):
            dt = self.idle_tick_s
        else:
            dt = max(0.0, next_arrival_s - self.clock) if math.isfinite(next_arrival_s) else 0.0
        self.clock += dt
        self.last_dt = dt
        self._num_prefill_seqs = 0

    # ------------------------------------------------------------------ observation
    def observe(self, buf: cython.float[::1], pool_end: cython.Py_ssize_t, queue_end: cython.Py_ssize_t,
                window: cython.Py_ssize_t, baseline: cython.double, capacity: cython.double,
                length_mode: cython.double) -> None:
        """Write ``obs["engine"]`` (from 0), the first ``window`` queue rows (from ``pool_end``) and
        ``obs["running"]`` (from ``queue_end``) into a zeroed observation buffer, in the orders of
        :mod:`servegym.engine.table`."""
        i: cython.Py_ssize_t
        j: cython.Py_ssize_t
        at: cython.Py_ssize_t
        k: cython.Py_ssize_t = min(len(self.waiting), window)
        n: cython.Py_ssize_t = self.num_running
        rid: cython.longlong
        waiting: cython.const[cython.longlong][:]
        run: cython.longlong[:, ::1] = self.run
        if not (NUM_ENGINE <= pool_end <= queue_end and 0 <= window <= (queue_end - pool_end) // QUEUE_WIDTH
                and queue_end + run.shape[0] * NUM_OBS <= buf.shape[0]):
            raise ValueError(f"observation buffer of {buf.shape[0]} floats does not fit this layout")
        if k:
            waiting = memoryview(self.waiting)
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
            for j in range(NUM_OBS):
                buf[queue_end + i * NUM_OBS + j] = run[i, j]
        features = (self.itl_last, self.itl_smoothed, baseline, n, self.num_prefilling, self.token_load,
                    len(self.waiting), 1.0 - cython.cast(cython.double, self.num_used_blocks) / self.num_kv_blocks,
                    self.kv_free_delta, capacity, self.block_size, self.last.num_preemptions,
                    self.last.num_admitted, self.last.num_finished, length_mode, self.chunk_limit, self.max_batched)
        for i, value in enumerate(features):  # ENGINE_FEATURES' order
            buf[i] = value

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Raise AssertionError if this engine's queue, running table or KV accounting is inconsistent."""
        log, n, bs = self._log, self.num_running, self.block_size
        rows = self._run_arr[:n]
        held = int(num_blocks(rows[:, KV], bs).sum())
        if self.prefix_cache is not None:
            cache = self.prefix_cache
            cache.check(rows[:, REQ].tolist())
            shared = sum(cache.held_units(rid) for rid in rows[:, REQ].tolist())
            held += (sum(1 for c in cache.refs.values() if c) - shared) * cache.unit_blocks
            if self.num_used_blocks + self.cached_free_blocks > self.num_kv_blocks:
                raise AssertionError("blocks in use plus free cached blocks exceed the KV cache")
            cached = log.cached_gpu_tokens + log.cached_host_tokens
            if np.any(cached >= np.maximum(log.num_prompt_tokens, 1)):
                raise AssertionError("a prefix hit covers a whole prompt")
        if held != self.num_used_blocks or not 0 <= self.num_used_blocks <= self.num_kv_blocks:
            raise AssertionError(f"KV accounting broken: rows hold {held}, used={self.num_used_blocks}")
        if np.unique(self.waiting).size != len(self.waiting):
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
        if self.phases_valid and not np.array_equal(
            self._phases_arr, np.bincount((rows[decoding, KV] - self.step_index) % bs, minlength=bs)
        ):
            raise AssertionError("the KV block phases of the decoding rows drifted from the running table")
        if decoding.any() and self._finish_countdown > int((rows[decoding, OUT] - rows[decoding, GEN]).min()):
            raise AssertionError("the finish countdown overshoots a decoding request's remaining tokens")
