"""A serverless pool of engines with one workload, a router, keep-alive and cold starts, and an event clock.

With several containers, each step advances the container whose decision is due first (the smallest clock
among those with work); requests that arrived by then are routed first. With one warm container (the
default) this is exactly one engine fed by the workload.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from servegym.backends.base import Backend
from servegym.engine.compiled import engine_class
from servegym.engine.config import EngineConfig, LengthMode, as_enum
from servegym.engine.engine import Engine
from servegym.engine.log import EpisodeLog
from servegym.engine.table import StepOutcome
from servegym.pool.routing import ROUTERS, Router
from servegym.validation import boolean, count, in_range, optional, positive_number
from servegym.workloads.base import Workload

MAX_POOL_SECONDS = 1e6
"""Longest keep-alive or cold start accepted (11.6 days): beyond it clocks would outrun the observation bounds."""


@dataclass(frozen=True)
class PoolConfig:
    """The serverless pool: how many containers, when they go cold, how requests are routed."""

    num_containers: int = field(default=1, metadata={"help": "model instances, each with its own engine and KV"})
    keep_alive_s: float | None = field(
        default=None, metadata={"help": "idle seconds after which a container goes cold (None: never)"}
    )
    cold_start_s: float | None = field(
        default=None, metadata={"help": "model load time of a cold container (None: the profile's)"}
    )
    cold_start_scale: float = field(
        default=1.0, metadata={"help": "multiplier on the cold start (ServerlessLLM-style fast loading < 1)"}
    )
    start_cold: bool = field(default=False, metadata={"help": "containers start cold (scale from zero)"})
    router: Router = field(default=Router.LEAST_LOADED, metadata={"help": "routing rule for arrivals"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "router", as_enum(Router, "router", self.router))
        count("num_containers", self.num_containers, "containers")
        for name in ("keep_alive_s", "cold_start_s"):
            optional(in_range(0.0, MAX_POOL_SECONDS))(name, getattr(self, name))
        positive_number("cold_start_scale", self.cold_start_scale)
        boolean("start_cold", self.start_cold)


class ClusterStep(NamedTuple):
    """One env step: one iteration of one container, then the routing of new arrivals."""

    container: int
    """The container that ran the iteration."""
    outcome: StepOutcome
    arrived: int
    rejected: int
    """Arrivals routed after the iteration, and how many of them could never fit."""
    latency_accrued_s: float
    """Request-seconds spent in the system during this step (arrival lags included); sums to total latency."""


class SkipRun(NamedTuple):
    """Iterations :meth:`Cluster.skip` ran in the engine's own loop, one list entry each, in order."""

    started_s: list[float]
    """The pool's clock before each."""
    outcomes: list[StepOutcome]
    latency_accrued_s: list[float]
    """As :attr:`ClusterStep.latency_accrued_s`; the last includes the lag of the arrivals routed after it."""
    finished_ids: dict[int, np.ndarray]
    """The ids each iteration that finished any finished, by its index."""
    last: ClusterStep
    """The last iteration as :meth:`Cluster.step` would have returned it."""


class Cluster:
    """Containers fed by one workload through a router.

    ``engine`` picks the engine implementation (see :func:`servegym.engine.compiled.engine_class`): ``"python"``,
    ``"compiled"``, or ``None``/``"auto"`` for the compiled one when it was built. Results are the same.
    """

    def __init__(self, config: EngineConfig, pool: PoolConfig, backends: list[Backend], workload: Workload,
                 cold_start_s: float = 0.0, engine: str | None = None) -> None:
        if len(backends) != pool.num_containers:
            raise ValueError(f"need one backend per container: {len(backends)} for {pool.num_containers}")
        self.config = config
        self.pool = pool
        self.workload = workload
        engine_type = engine_class(engine)
        self.engines = [engine_type(config, backend, container=c) for c, backend in enumerate(backends)]
        base = pool.cold_start_s if pool.cold_start_s is not None else cold_start_s
        self.cold_start_s = base * pool.cold_start_scale
        if self.cold_start_s > MAX_POOL_SECONDS:
            raise ValueError(f"cold start {self.cold_start_s:g} s (cold_start_s x cold_start_scale) exceeds "
                             f"{MAX_POOL_SECONDS:g} s")
        self._route = ROUTERS[pool.router]
        # Episode state, set by reset().
        self.log: EpisodeLog | None = None
        self.done = True
        """The workload is exhausted and every container is empty."""
        self.time = 0.0
        """The pool's clock: the earliest clock among containers with work."""
        self.deciding = 0
        """The container whose decision the next step takes."""
        self.num_rejected = 0
        self.last_arrived = self.last_rejected = 0
        """Arrivals routed, and how many of them were rejected, when the episode started."""
        self._num_requests = 0
        self._next_arrival = 0
        """Index of the next request to arrive (requests are sorted by arrival time)."""
        self._arrival_times: list[float] = []
        """The log's arrival times as plain floats, read one at a time on the per-step path."""
        self._num_in_system = 0
        """Requests in the system up to ``time`` (for the latency reward)."""
        self._route_turn = 0
        """Arrivals routed so far (the round-robin router's turn)."""
        self._pending_ends: list[float] = []
        """Finish times recorded by containers that ran ahead of ``time``, as a heap."""

    # ------------------------------------------------------------------ episode
    def reset(self, rng: np.random.Generator) -> None:
        """Draw the workload, hide or reveal lengths, and route the first arrivals."""
        cfg = self.config
        spec = self.workload.sample(rng)
        output = np.minimum(spec.num_output_tokens, cfg.max_tokens)
        lo, hi = length_intervals(cfg, rng, output)
        first = self.engines[0]
        self.log = EpisodeLog(spec.arrival_s, spec.num_prompt_tokens, output, lo, hi,
                              spec.num_output_tokens > cfg.max_tokens, first.num_kv_blocks, first.block_size,
                              len(self.engines), spec.prefix)
        self.time = float(spec.arrival_s[0]) if len(spec) else 0.0
        ready = math.inf if self.pool.start_cold else -math.inf
        for engine in self.engines:
            engine.reset(self.log, rng, self.time, ready_at=ready)
        self._next_arrival = 0
        self._num_requests = self.log.num_requests
        self._arrival_times = self.log.arrival_s.tolist()
        self._route_turn = 0
        self._num_in_system = 0
        self._pending_ends = []
        self.num_rejected = 0
        self.deciding = 0
        # The clock starts at the first arrival, so these arrivals have no lag to account for.
        self.last_arrived, self.last_rejected, _ = self._route_arrivals()
        self._choose()
        self._update_done()
        if cfg.check_invariants:
            self.check_invariants()

    @property
    def engine(self) -> Engine:
        """The container whose decision is due."""
        return self.engines[self.deciding]

    def _update_done(self) -> None:
        """``done``: the workload is exhausted and every container is empty."""
        if self._next_arrival < self._num_requests:
            self.done = False
        elif len(self.engines) == 1:  # the common case, on the per-step path
            engine = self.engines[0]
            self.done = not (engine.waiting.size or engine.num_running)
        else:
            self.done = not any(e.has_work for e in self.engines)

    @property
    def num_arrived(self) -> int:
        """Requests of the episode that have arrived (routed to a container or rejected)."""
        return self._next_arrival

    @property
    def next_arrival_s(self) -> float:
        return self._arrival_times[self._next_arrival] if self._next_arrival < self._num_requests else math.inf

    # ------------------------------------------------------------------ step
    def step(self, admit: np.ndarray) -> ClusterStep:
        if self.done:
            raise RuntimeError("the episode is over (workload exhausted, system empty); call reset()")
        container = self.deciding
        engine = self.engines[container]
        out = engine.step(admit, self.next_arrival_s)
        for _ in range(out.num_finished):
            heapq.heappush(self._pending_ends, engine.clock)
        old_time = self.time
        if len(self.engines) == 1:
            self.time = max(old_time, engine.clock)
        else:
            busy = [e.clock for e in self.engines if e.waiting.size or e.num_running]
            self.time = max(old_time, min(busy) if busy else engine.clock)
        accrued = self._advance(old_time)
        arrived, rejected, lag = self._route_arrivals()
        self._choose()
        self._update_done()
        if self.config.check_invariants:
            self.check_invariants()
        return ClusterStep(container, out, arrived, rejected, accrued + lag)

    def skip(self, limit: int) -> SkipRun | None:
        """One container only: the iterations that :meth:`step` with nothing to admit would run while nothing can
        be admitted and nothing arrives, at most ``limit``, run in the engine's own loop (:meth:`Engine.skip`).

        Returns them column-wise (None if none ran); the arrivals due after the last are routed, as :meth:`step`
        routes them, and counted in ``last``.
        """
        if len(self.engines) != 1 or self.config.check_invariants:
            raise RuntimeError("the engine's own loop serves one container without invariant checks")
        engine, rows = self.engines[0], self.log.step_rows[0]
        start = len(rows)
        outcomes, finished = engine.skip(self.next_arrival_s, limit)
        if not outcomes:
            return None
        # With one container every finish is at the pool's clock, so none is pending past a step (see _advance).
        time, in_system, started, accrued = self.time, self._num_in_system, [], []
        for outcome, row in zip(outcomes, rows[start:], strict=True):
            end = max(time, row[0])  # the row's end_s
            started.append(time)
            accrued.append(in_system * (end - time))
            in_system -= outcome.num_finished
            time = end
        self.time, self._num_in_system = time, in_system
        arrived, rejected, lag = self._route_arrivals()
        accrued[-1] += lag
        last = tuple.__new__(ClusterStep, (0, outcomes[-1], arrived, rejected, accrued[-1]))  # without its frame
        self._update_done()
        return SkipRun(started, outcomes, accrued, dict(finished), last)

    def _advance(self, old_time: float) -> float:
        """Request-seconds in the system between ``old_time`` and ``self.time``."""
        accrued = self._num_in_system * (self.time - old_time)
        while self._pending_ends and self._pending_ends[0] <= self.time:
            end = heapq.heappop(self._pending_ends)
            accrued -= self.time - max(end, old_time)
            self._num_in_system -= 1
        return accrued

    def _route_arrivals(self) -> tuple[int, int, float]:
        """Route every request that arrived by ``self.time``; return (arrived, rejected, summed lag)."""
        log, times, now, n = self.log, self._arrival_times, self.time, self._num_requests
        stop = self._next_arrival
        while stop < n and times[stop] <= now:  # arrivals come a few at a time: a scan beats a search
            stop += 1
        if stop == self._next_arrival:
            return 0, 0, 0.0
        ids = np.arange(self._next_arrival, stop)
        if len(self.engines) == 1:  # the common case: no routing decision to make
            self._load_if_cold(self.engines[0])
            groups = [(0, ids)]
        else:
            targets = np.array([self._pick() for _ in range(ids.size)])
            groups = [(int(c), ids[targets == c]) for c in np.unique(targets)]
        rejected, lag = 0, 0.0
        for c, routed in groups:
            engine = self.engines[c]
            if engine.ready_at > self.time:  # they wait for the model to load
                log.cold_start[routed] = True
                log.load_wait_s[routed] = engine.ready_at - self.time
            refused, waited = engine.receive(routed, self.time)
            rejected += refused
            lag += waited
        self._num_in_system += ids.size - rejected
        self._next_arrival = stop
        self.num_rejected += rejected
        return ids.size, rejected, lag

    def _pick(self) -> int:
        """Route one arrival: the router's choice among the containers, which starts loading if cold."""
        engines, now = self.engines, self.time
        load = np.array([e.waiting.size + e.num_running for e in engines], dtype=np.int64)
        holds = np.array([not self.is_cold(e, now) for e in engines])
        c = self._route(load, holds, self._route_turn)
        self._route_turn += 1
        self._load_if_cold(engines[c])
        return c

    def _load_if_cold(self, engine: Engine) -> None:
        if self.is_cold(engine, self.time):
            engine.ready_at = self.time + self.cold_start_s

    def is_cold(self, engine: Engine, now: float) -> bool:
        """Cold: never loaded, or idle for longer than the keep-alive (and not loading)."""
        if engine.ready_at == math.inf:
            return True
        keep = self.pool.keep_alive_s
        return keep is not None and not engine.has_work and now - engine.idle_since > keep

    def _choose(self) -> None:
        """The deciding container: the earliest clock among those with work (else among all), lowest index on ties."""
        if len(self.engines) == 1:
            return
        best, best_clock, best_busy = 0, math.inf, False
        for e in self.engines:
            busy = bool(e.waiting.size or e.num_running)
            if (busy and not best_busy) or (busy == best_busy and e.clock < best_clock):
                best, best_clock, best_busy = e.container, e.clock, busy
        self.deciding = best

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Raise AssertionError if conservation or any engine's accounting is broken."""
        c = self.log.counts()
        if c["num_arrived"] != c["num_waiting"] + c["num_running"] + c["num_finished"] + c["num_rejected"]:
            raise AssertionError(f"conservation broken: {c}")
        queued = sum(e.waiting.size for e in self.engines)
        running = sum(e.num_running for e in self.engines)
        finished = sum(e.num_finished for e in self.engines)
        if (c["num_arrived"], c["num_waiting"], c["num_running"], c["num_finished"], c["num_rejected"]) != (
            self._next_arrival, queued, running, finished, self.num_rejected
        ):
            raise AssertionError(f"counters disagree with states: {c} vs arrived={self._next_arrival} queue={queued} "
                                 f"running={running} finished={finished} rejected={self.num_rejected}")
        for engine in self.engines:
            engine.check_invariants()


def length_intervals(config: EngineConfig, rng: np.random.Generator, output: np.ndarray) -> tuple[np.ndarray,
                                                                                                    np.ndarray]:
    """The ``[lo, hi]`` a policy observes for each true output length under ``config.length_mode``."""
    mode = config.length_mode
    if mode is LengthMode.KNOWN:
        return output.copy(), output.copy()
    if mode is LengthMode.UNKNOWN:
        return np.ones_like(output), np.full_like(output, config.max_tokens)
    err = config.prediction_error
    u = rng.random((2, output.size))
    lo = np.maximum(1, np.floor(output * (1.0 - err * u[0]))).astype(np.int64)
    hi = np.minimum(config.max_tokens, np.ceil(output * (1.0 + err * u[1]))).astype(np.int64)
    return lo, hi


