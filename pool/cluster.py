"""A pool of engines with one workload, a router, keep-alive and cold starts, and an event clock: a serverless
pool, or (no keep-alive, warm from the start) a cluster of always-warm replicas, heterogeneous if ``profiles`` says.

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

from servegym.backends.base import EMPTY, Backend
from servegym.engine.compiled import engine_class
from servegym.engine.config import EngineConfig, LengthMode, as_enum
from servegym.engine.engine import Engine
from servegym.engine.log import EpisodeLog
from servegym.engine.prediction import predict_lengths, predicted_interval
from servegym.engine.table import StepOutcome
from servegym.pool.routing import ROUTERS, Router, RouteState
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
    prefix_weight: float = field(
        default=1.0, metadata={"help": "kv_aware router: cost per KV block the arrival must prefill"}
    )
    load_weight: float = field(
        default=1.0, metadata={"help": "kv_aware router: cost per KV block a replica holds in use or queued"}
    )
    profiles: tuple[str, ...] = field(
        default=(), metadata={"help": "one calibrated profile per container (empty: the env's profile for all)"}
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "router", as_enum(Router, "router", self.router))
        count("num_containers", self.num_containers, "containers")
        for name in ("prefix_weight", "load_weight"):
            in_range(0.0, 1e6)(name, getattr(self, name))
        if self.prefix_weight == self.load_weight == 0:
            raise ValueError("prefix_weight and load_weight are both 0: the kv_aware router would have no cost")
        if isinstance(self.profiles, str) or not all(isinstance(p, str) and p for p in self.profiles):
            raise TypeError(f"profiles must be a sequence of profile names, got {self.profiles!r}")
        object.__setattr__(self, "profiles", tuple(self.profiles))
        if self.profiles and len(self.profiles) != self.num_containers:
            raise ValueError(f"profiles names {len(self.profiles)} profiles for {self.num_containers} containers")
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
        self._earliest, self._stalled = engine_type.earliest, engine_type.stalled
        """The scans of :meth:`_choose` and :meth:`stalled` (the engines' class's, compiled with them where they
        are)."""
        self._observe_pool = engine_type.observe_pool
        base = pool.cold_start_s if pool.cold_start_s is not None else cold_start_s
        self.cold_start_s = base * pool.cold_start_scale
        self.keep_alive_s = math.inf if pool.keep_alive_s is None else pool.keep_alive_s
        """Seconds a container with nothing to do stays warm (inf: for ever)."""
        if self.cold_start_s > MAX_POOL_SECONDS:
            raise ValueError(f"cold start {self.cold_start_s:g} s (cold_start_s x cold_start_scale) exceeds "
                             f"{MAX_POOL_SECONDS:g} s")
        if len({e.block_size for e in self.engines}) > 1:
            raise ValueError("every container's KV block size must be the same (the log and prefix chains count in "
                             f"one): got {[e.block_size for e in self.engines]}")
        blocks = tuple(e.num_kv_blocks for e in self.engines)
        self._kv_blocks = blocks if len(set(blocks)) > 1 else ()
        self._route = ROUTERS.get(pool.router)
        """The router's rule (None for ``Router.AGENT``: :meth:`route` places each arrival)."""
        self._route_rng: np.random.Generator | None = None
        """The routing stream (``power_of_two``), spawned from the episode's generator at reset."""
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
                              len(self.engines), spec.prefix, self._kv_blocks)
        self.time = float(spec.arrival_s[0]) if len(spec) else 0.0
        ready = math.inf if self.pool.start_cold else -math.inf
        for engine in self.engines:
            engine.reset(self.log, rng, self.time, ready_at=ready)
        self._next_arrival = 0
        self._num_requests = self.log.num_requests
        self._arrival_times = self.log.arrival_s.tolist()
        self._route_turn = 0
        # A child stream, so that drawing it leaves the episode's own draws as they are without it.
        self._route_rng = rng.spawn(1)[0] if self.pool.router is Router.POWER_OF_TWO else None
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
        else:  # no container has work: the scan's third value, the rule written once
            self.done = not self._earliest(self.engines)[2]

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
        self.require_routed()
        container = self.deciding
        engine = self.engines[container]
        out = engine.step(admit, self.next_arrival_s)
        old_time = self.time
        if len(self.engines) == 1:
            for _ in range(out.num_finished):
                heapq.heappush(self._pending_ends, engine.clock)
            self.time = max(old_time, engine.clock)
            accrued = self._advance(old_time)
            arrived, rejected, lag = self._route_arrivals()
            self._update_done()
        else:
            accrued, arrived, rejected, lag = self._after_iteration(engine, out, old_time)
        if self.config.check_invariants:
            self.check_invariants()
        return ClusterStep(container, out, arrived, rejected, accrued + lag)

    def _after_iteration(self, engine: Engine, out: StepOutcome, old_time: float) -> tuple[float, int, int, float]:
        """A pool of several, after an iteration of ``engine`` (``out``) that began at pool time ``old_time``: its
        finishes pending, the pool's clock (the earliest among the containers with work), the latency integral, the
        arrivals now due routed and the deciding container. Returns (request-seconds accrued, arrived, rejected,
        summed lag)."""
        for _ in range(out.num_finished):
            heapq.heappush(self._pending_ends, engine.clock)
        deciding, clock, busy = self._earliest(self.engines)
        self.time = max(old_time, clock if busy else engine.clock)
        accrued = self._advance(old_time)
        arrived, rejected, lag = self._route_arrivals()
        if arrived:  # delivered: the containers with work may have changed
            self._choose()
            self._update_done()
        else:  # as before routing
            self.deciding = deciding
            self.done = not busy and self._next_arrival >= self._num_requests
        return accrued, arrived, rejected, lag

    def skip(self, limit: int) -> SkipRun | None:
        """The iterations that :meth:`step` with nothing to admit would run before there is anything to decide, at
        most ``limit``, without returning between them (none with ``check_invariants``).

        One container: in the engine's own loop (:meth:`Engine.skip`), while nothing can be admitted and nothing
        arrives; the arrivals due after the last are routed, as :meth:`step` routes them. Several: :meth:`step`'s
        iterations, while the deciding container has rows running and cannot admit, no arrival is routed or waits
        to be, the pool is not done and no request waits while nothing runs or loads; the iteration that breaks one
        of these is the run's last.

        Returns them column-wise, the last also as :meth:`step` would have returned it (None if none ran).
        """
        if self.config.check_invariants:
            raise RuntimeError("the engine's own loop runs without invariant checks")
        if len(self.engines) > 1:
            return self._skip_pool(limit)
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

    def _skip_pool(self, limit: int) -> SkipRun | None:
        """:meth:`skip` for a pool of several containers."""
        engines, started, outcomes, accrued, finished = self.engines, [], [], [], {}
        ran = arrived = rejected = 0
        while len(outcomes) < limit and not self.done and not self.awaiting_route:
            engine = engines[self.deciding]
            if not engine.num_running or engine.can_admit():
                break
            ran = self.deciding
            started.append(self.time)
            out = engine.step(EMPTY, self.next_arrival_s)
            if out.num_finished:
                finished[len(outcomes)] = engine.last_finished_ids
            outcomes.append(out)
            gained, arrived, rejected, lag = self._after_iteration(engine, out, started[-1])
            accrued.append(gained + lag)
            if arrived or self._stalled(engines, self.time) or engines[self.deciding].can_admit():
                break  # the pool being done or a request waiting to be routed ends the run at the loop's test
        if not outcomes:
            return None
        last = tuple.__new__(ClusterStep, (ran, outcomes[-1], arrived, rejected, accrued[-1]))
        return SkipRun(started, outcomes, accrued, finished, last)

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
        times, now, n = self._arrival_times, self.time, self._num_requests
        stop = self._next_arrival
        while stop < n and times[stop] <= now:  # arrivals come a few at a time: a scan beats a search
            stop += 1
        if stop == self._next_arrival:
            return 0, 0, 0.0
        if self._route is None:  # they wait for route()
            return 0, 0, 0.0
        ids = np.arange(self._next_arrival, stop)
        if len(self.engines) == 1:  # the common case: no routing decision to make
            self._load_if_cold(self.engines[0])
            rejected, lag = self._deliver(0, ids)
        else:  # one at a time: each router sees the arrivals routed before it
            rejected, lag = 0, 0.0
            for rid in ids.tolist():
                refused, waited = self._deliver(self._pick(rid), np.array([rid], dtype=np.int64))
                rejected += refused
                lag += waited
        self._next_arrival = stop
        return ids.size, rejected, lag

    def _deliver(self, c: int, ids: np.ndarray) -> tuple[int, float]:
        """Queue arrivals ``ids`` at container ``c`` now; return (rejected, summed lag)."""
        engine, log = self.engines[c], self.log
        if engine.ready_at > self.time:  # they wait for the model to load
            log.cold_start[ids] = True
            log.load_wait_s[ids] = engine.ready_at - self.time
        rejected, lag = engine.receive(ids, self.time)
        self._num_in_system += ids.size - rejected
        self.num_rejected += rejected
        return rejected, lag

    # ------------------------------------------------------------------ routing
    @property
    def awaiting_route(self) -> bool:
        """``Router.AGENT``: a request has arrived and waits for :meth:`route` (always False for other routers)."""
        return self._route is None and self._next_arrival < self._num_requests \
            and self._arrival_times[self._next_arrival] <= self.time

    def require_routed(self) -> None:
        """Raise unless every arrival is routed (``Router.AGENT``: none waits for :meth:`route`)."""
        if self.awaiting_route:
            raise RuntimeError(f"request {self._next_arrival} has arrived and waits to be routed: call route()")

    def route(self, container: int) -> tuple[int, float]:
        """``Router.AGENT``: send the request that waits to be routed to ``container`` (which starts loading if
        cold). Returns (rejected: 0 or 1, its lag from arrival to now); ``done`` is updated."""
        if not self.awaiting_route:
            raise RuntimeError("no request waits to be routed (the router is not 'agent', or none has arrived)")
        if not 0 <= container < len(self.engines):
            raise ValueError(f"container must be in [0, {len(self.engines)}), got {container!r}")
        self._route_turn += 1
        self._load_if_cold(self.engines[container])
        rid = self._next_arrival
        rejected, lag = self._deliver(container, np.array([rid], dtype=np.int64))
        self._next_arrival += 1
        self._choose()
        self._update_done()
        if self.config.check_invariants:
            self.check_invariants()
        return rejected, lag

    @property
    def routing_request(self) -> int:
        """The id of the next request to arrive: the one :meth:`route` places when ``awaiting_route``."""
        return self._next_arrival

    def route_state(self, rid: int) -> RouteState:
        """What a router sees of the containers now for request ``rid``."""
        engines, log = self.engines, self.log
        prompt = int(log.num_prompt_tokens[rid])
        cached = np.array([sum(e.cached_prompt_tokens(rid)) for e in engines], dtype=np.int64)
        return RouteState(
            load=np.array([e.waiting.size + e.num_running for e in engines], dtype=np.int64),
            free_blocks=np.array([e.num_kv_blocks - e.num_used_blocks for e in engines], dtype=np.int64),
            used_blocks=np.array([e.num_used_blocks for e in engines], dtype=np.int64),
            queued_blocks=np.array([int((-(-log.num_prompt_tokens[e.waiting] // e.block_size)).sum())
                                    for e in engines], dtype=np.int64),
            cached_tokens=cached,
            fits=np.array([prompt + int(log.output_lo[rid]) <= e.num_kv_blocks * e.block_size for e in engines]),
            holds_model=np.array([not self.is_cold(e, self.time) for e in engines]),
            prompt_tokens=prompt, block_size=engines[0].block_size, turn=self._route_turn,
            prefix_weight=self.pool.prefix_weight, load_weight=self.pool.load_weight, rng=self._route_rng)

    def _pick(self, rid: int) -> int:
        """Route arrival ``rid``: the router's choice among the containers, which starts loading if cold."""
        c = self._route(self.route_state(rid))
        self._route_turn += 1
        self._load_if_cold(self.engines[c])
        return c

    def _load_if_cold(self, engine: Engine) -> None:
        if self.is_cold(engine, self.time):
            engine.ready_at = self.time + self.cold_start_s

    def is_cold(self, engine: Engine, now: float) -> bool:
        """Cold: never loaded, or idle for longer than the keep-alive (and not loading)."""
        return engine.is_cold(now, self.keep_alive_s)

    def observe_pool(self, out: np.ndarray) -> int:
        """Write ``obs["pool"]`` (one row per container, :meth:`Engine.observe_pool`) into the float32 ``out``;
        return the requests finished so far."""
        return self._observe_pool(self.engines, self.deciding, self.time, self.keep_alive_s, out)

    def stalled(self) -> bool:
        """Requests wait somewhere while no container runs anything or loads a model."""
        return self._stalled(self.engines, self.time)

    def _choose(self) -> None:
        """The deciding container: the earliest clock among those with work (else among all), lowest index on ties."""
        if len(self.engines) > 1:
            self.deciding = self._earliest(self.engines)[0]

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
    """The ``[lo, hi]`` a policy observes for each true output length under ``config.length_mode``
    (:mod:`servegym.engine.prediction` says what the predicted and truth-interval modes model)."""
    mode = config.length_mode
    if mode is LengthMode.KNOWN:
        return output.copy(), output.copy()
    if mode is LengthMode.UNKNOWN:
        return np.ones_like(output), np.full_like(output, config.max_tokens)
    if mode is LengthMode.PREDICTED:
        return predicted_interval(predict_lengths(output, rng, config.max_tokens), config.max_tokens)
    # The truth interval: lo = floor(true * (1 - e * u1)), hi = ceil(true * (1 + e * u2)), u ~ U(0, 1).
    err = config.prediction_error
    u = rng.random((2, output.size))
    lo = np.maximum(1, np.floor(output * (1.0 - err * u[0]))).astype(np.int64)
    hi = np.minimum(config.max_tokens, np.ceil(output * (1.0 + err * u[1]))).astype(np.int64)
    return lo, hi


