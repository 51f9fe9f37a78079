"""Observation layout shared by the env, hand-coded policies and learned agents."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from servegym.engine import table
from servegym.engine.config import LengthMode
from servegym.engine.engine import Engine
from servegym.pool.cluster import Cluster

BIG = 1e9
"""Upper bound of unbounded counts, tokens and seconds (finite, so that checkers and normalisers accept it)."""


@dataclass(frozen=True)
class Feature:
    """One observed quantity: its name, its bounds in the observation space and what it means."""

    name: str
    meaning: str
    low: float = 0.0
    high: float = BIG


ENGINE_SCHEMA = (
    Feature("itl_last_s", "latency of the last iteration that decoded (s)"),
    Feature("itl_smoothed_s", "EMA of itl_last_s (weight EngineConfig.itl_smoothing)"),
    Feature("baseline_step_s", "the profile's l_min (0 when the backend has none)"),
    Feature("num_running", "running requests (prefilling + decoding)"),
    Feature("num_prefilling", "running requests still ingesting their prompt"),
    Feature("token_load", "sum over running requests of output_hi - num_generated: tokens left if each stops at its "
            "upper bound (a request that outgrew a wrong prediction counts negative)", -BIG),
    Feature("num_waiting", "waiting requests (all of them, not only the visible window)"),
    Feature("kv_free_frac", "free KV blocks / all blocks", 0.0, 1.0),
    Feature("kv_free_delta", "EMA of the per-step change of kv_free_frac (negative while KV fills)", -1.0, 1.0),
    Feature("kv_capacity_tokens", "KV blocks x block size"),
    Feature("kv_block_size", "tokens per KV block: a request holds ceil(tokens / block size) blocks"),
    Feature("last_num_preemptions", "requests preempted in the last iteration"),
    Feature("last_num_admitted", "requests admitted in the last iteration"),
    Feature("last_num_finished", "requests finished in the last iteration"),
    Feature("length_mode", "what output_lo/hi mean: 0 known (exact), 1 truth_interval (contains the truth; "
            "'predicted' before Serving-v2), 2 unknown ([1, max]), 3 predicted (a real predictor's, often wrong)",
            0.0, 3.0),
    Feature("prefill_chunk_tokens", "most prompt tokens one request ingests per step"),
    Feature("max_num_batched_tokens", "per-step token budget (decodes + prefill chunks)"),
)
"""``obs["engine"]``: one vector about the deciding container."""

QUEUE_SCHEMA = (
    Feature("num_prompt_tokens", "prompt tokens"),
    Feature("wait_s", "seconds since arrival"),
    Feature("wait_steps", "iterations since it first joined this container's queue (kept through preemptions)"),
    Feature("output_lo", "lower bound of the output length"),
    Feature("output_hi", "upper bound of the output length"),
    Feature("num_generated", "output tokens to recompute (> 0 marks a preempted request)"),
)
"""``obs["queue"]``: one row per visible waiting request, queue head first (the queue window)."""

RUNNING_SCHEMA = (
    Feature("num_prompt_tokens", "prompt tokens"),
    Feature("num_kv_tokens", "tokens held in the KV cache"),
    Feature("num_generated", "output tokens generated"),
    Feature("output_lo", "lower bound of the output length"),
    Feature("output_hi", "upper bound of the output length"),
    Feature("num_prefill_left", "prompt tokens still to ingest (0 once decoding)"),
)
"""``obs["running"]``: one row per running request, in activation order."""

POOL_SCHEMA = (
    Feature("deciding", "1 for the container whose decision this is", -BIG),
    Feature("warmth", "1 warm, 0 cold, minus the seconds left while the model loads", -BIG),
    Feature("idle_s", "seconds idle (0 while busy)", -BIG),
    Feature("num_waiting", "its waiting requests", -BIG),
    Feature("num_running", "its running requests", -BIG),
    Feature("kv_free_frac", "its free KV fraction", -BIG),
)
"""``obs["pool"]``: one row per container."""

PROGRESS_SCHEMA = (
    Feature("elapsed_s", "seconds since the episode's first arrival"),
    Feature("arrival_span_s", "seconds from the episode's first arrival to its last (fixed per episode)"),
    Feature("arrived_frac", "requests arrived / requests in the episode", 0.0, 1.0),
    Feature("remaining_frac", "requests neither finished nor rejected / requests in the episode", 0.0, 1.0),
)
"""``obs["progress"]``: how far the episode has gone, in time and in requests: an agent's sense of the horizon
(a time-limit feature). It tells the episode's length (its last arrival, its request count), which the env
fixes at reset; every policy sees it, and the hand-coded ones do not read it."""

PREFIX_SCHEMA = (
    Feature("cached_free_blocks", "KV blocks holding cached prefixes no running request uses: reusable, and "
            "evicted least recently used first when blocks run short"),
    Feature("host_cached_tokens", "KV tokens of prefixes kept in the host-memory tier"),
)
"""``obs["prefix"]`` (with prefix caching only): the deciding container's prefix cache."""

QUEUE_PREFIX_SCHEMA = (
    Feature("cached_gpu_tokens", "prompt tokens admitting it now would find cached in GPU memory (not prefilled)"),
    Feature("cached_host_tokens", "prompt tokens after those it would find in the host tier (copied back, not "
            "prefilled)"),
)
"""``obs["queue_prefix"]`` (with prefix caching only): one row per visible waiting request, as ``obs["queue"]``."""

PREFIX_KEYS = {"prefix": PREFIX_SCHEMA, "queue_prefix": QUEUE_PREFIX_SCHEMA}
"""The keys an env with ``prefix_caching`` adds (the others' layouts are unchanged)."""

SCHEMA = {"engine": ENGINE_SCHEMA, "queue": QUEUE_SCHEMA, "running": RUNNING_SCHEMA, "pool": POOL_SCHEMA,
          "progress": PROGRESS_SCHEMA}
"""Every observation key and its features: the spaces, the encoder, the accessors and the env docstring's
table are derived from it."""

ENGINE_FEATURES = tuple(f.name for f in ENGINE_SCHEMA)
QUEUE_FEATURES = tuple(f.name for f in QUEUE_SCHEMA)
RUNNING_FEATURES = tuple(f.name for f in RUNNING_SCHEMA)
POOL_FEATURES = tuple(f.name for f in POOL_SCHEMA)
PROGRESS_FEATURES = tuple(f.name for f in PROGRESS_SCHEMA)
ENGINE_INDEX = {name: i for i, name in enumerate(ENGINE_FEATURES)}
POOL_INDEX = {name: i for i, name in enumerate(POOL_FEATURES)}
QUEUE_INDEX = {name: i for i, name in enumerate(QUEUE_FEATURES)}
QUEUE_PREFIX_FEATURES = tuple(f.name for f in QUEUE_PREFIX_SCHEMA)
RUNNING_INDEX = {name: i for i, name in enumerate(RUNNING_FEATURES)}
if (RUNNING_FEATURES, ENGINE_FEATURES, QUEUE_FEATURES, POOL_FEATURES) != (
        table.RUNNING_OBS_COLUMNS, table.ENGINE_FEATURES, table.QUEUE_FEATURES, table.POOL_FEATURES):
    raise ImportError("the observation schema changed: update Engine.observe (and observe_pool) in "
                      "servegym/engine/engine.py and the orders in servegym/engine/table.py")
LENGTH_MODE_CODE = {LengthMode.KNOWN: 0.0, LengthMode.TRUTH_INTERVAL: 1.0, LengthMode.UNKNOWN: 2.0,
                    LengthMode.PREDICTED: 3.0}
"""The ``length_mode`` feature's value for each :class:`LengthMode`. A code keeps its meaning: 1 was ``predicted``
while that mode's interval contained the truth, so the interval that still does keeps it and the realistic
``predicted`` mode takes the new code 3 (legacy envs observe what they did)."""


if set(LENGTH_MODE_CODE) != set(LengthMode):
    raise ImportError("LENGTH_MODE_CODE must give every LengthMode a code")
_LENGTH_MODES = tuple(sorted(LENGTH_MODE_CODE, key=LENGTH_MODE_CODE.__getitem__))
_LENGTH_MODE_INDEX = ENGINE_INDEX["length_mode"]


def length_mode_of(obs: dict[str, np.ndarray]) -> LengthMode:
    """The :class:`LengthMode` an observation was made under."""
    return _LENGTH_MODES[int(obs["engine"][_LENGTH_MODE_INDEX])]


def _box(schema: tuple[Feature, ...], rows: int) -> spaces.Box:
    low = np.tile(np.array([f.low for f in schema], dtype=np.float32), rows)
    high = np.tile(np.array([f.high for f in schema], dtype=np.float32), rows)
    return spaces.Box(low, high, dtype=np.float32)


def observation_space(queue_window: int, running_slots: int, num_containers: int,
                      prefix: bool = False) -> spaces.Dict:
    """The Dict space; ``prefix`` adds :data:`PREFIX_KEYS` (an env with prefix caching)."""
    boxes = {
        "engine": _box(ENGINE_SCHEMA, 1),
        "queue": _box(QUEUE_SCHEMA, queue_window),
        "running": _box(RUNNING_SCHEMA, running_slots),
        "pool": _box(POOL_SCHEMA, num_containers),
        "progress": _box(PROGRESS_SCHEMA, 1),
    }
    if prefix:
        boxes.update(prefix=_box(PREFIX_SCHEMA, 1), queue_prefix=_box(QUEUE_PREFIX_SCHEMA, queue_window))
    return spaces.Dict(boxes)


SCALED_BOUND = float(np.log1p(BIG))
"""Bound of every scaled feature: ``symlog(BIG)``."""


def scaled_observation_space(space: spaces.Dict) -> spaces.Dict:
    """The space of :func:`scale_observation`: the same keys and shapes, every feature in
    ``[-SCALED_BOUND, SCALED_BOUND]``."""
    return spaces.Dict({key: spaces.Box(-SCALED_BOUND, SCALED_BOUND, box.shape, dtype=np.float32)
                        for key, box in space.spaces.items()})


def scale_observation(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The observation for a learning agent: every feature on a symmetric log scale, ``sign(x) log(1 + |x|)``,
    so counts, tokens and seconds of any size land within a few units (a 10-token and a 10,000-token prompt
    differ by 6.9) and stay bounded by :data:`SCALED_BOUND`, with no running statistics. The task's sizes
    (``kv_capacity_tokens``, ``kv_block_size``, ``max_num_batched_tokens``, ``prefill_chunk_tokens``) and the
    episode's progress (``obs["progress"]``) are among the features. Hand-coded policies read the raw Dict."""
    return {key: (np.sign(value) * np.log1p(np.abs(value))).astype(np.float32) for key, value in obs.items()}


def schema_table() -> str:
    """The observation schema as a Markdown table (key, feature, bounds, meaning), for docs."""
    lines = ["| key | feature | bounds | meaning |", "|-----|---------|--------|---------|"]
    for key, schema in {**SCHEMA, **PREFIX_KEYS}.items():
        only = " (prefix caching only)" if key in PREFIX_KEYS else ""
        for f in schema:
            bounds = f"[{f.low:g}, {f.high:g}]".replace("1e+09", "BIG")
            lines.append(f"| `{key}` | `{f.name}` | {bounds} | {f.meaning}{only} |")
    return "\n".join(lines)


def queue_matrix(obs: dict[str, np.ndarray]) -> np.ndarray:
    """``obs["queue"]`` as a ``(W, len(QUEUE_FEATURES))`` view (a leading batch axis is kept)."""
    q = obs["queue"]
    if q.ndim == 1:
        return q.reshape(-1, len(QUEUE_FEATURES))
    return q.reshape(*q.shape[:-1], -1, len(QUEUE_FEATURES))


def queue_prefix_matrix(obs: dict[str, np.ndarray]) -> np.ndarray:
    """``obs["queue_prefix"]`` as a ``(W, len(QUEUE_PREFIX_FEATURES))`` view; zeros of that shape for an
    observation without prefix caching (nothing is cached)."""
    q = obs.get("queue_prefix")
    if q is None:
        width = obs["queue"].shape[-1] // len(QUEUE_FEATURES)
        return np.zeros((*obs["queue"].shape[:-1], width, len(QUEUE_PREFIX_FEATURES)), dtype=np.float32)
    return q.reshape(*q.shape[:-1], -1, len(QUEUE_PREFIX_FEATURES))


def running_matrix(obs: dict[str, np.ndarray]) -> np.ndarray:
    """``obs["running"]`` as a ``(max_num_seqs, len(RUNNING_FEATURES))`` view."""
    r = obs["running"]
    if r.ndim == 1:
        return r.reshape(-1, len(RUNNING_FEATURES))
    return r.reshape(*r.shape[:-1], -1, len(RUNNING_FEATURES))


class ObservationEncoder:
    """Builds observations from a pool's deciding engine.

    Every observation is one fresh float32 buffer in ``gymnasium.spaces.flatten``'s layout of the Dict space
    (keys in sorted order: engine, pool, [prefix,] progress, queue, [queue_prefix,] running): ``flat=True`` returns
    the buffer itself, otherwise a dict of views into it. One allocation per step either way, and a flat observation
    costs nothing extra. The engine writes its part itself (:meth:`~servegym.engine.Engine.observe`), queue window
    included.
    """

    def __init__(self, queue_window: int, running_slots: int, num_containers: int = 1, flat: bool = False,
                 prefix: bool = False) -> None:
        self.queue_window = queue_window
        self.running_slots = running_slots
        self.flat = flat
        self.prefix = prefix
        width = len(QUEUE_PREFIX_FEATURES) if prefix else 0
        sizes = {"engine": len(ENGINE_FEATURES), "pool": num_containers * len(POOL_FEATURES),
                 "prefix": len(PREFIX_SCHEMA) if prefix else 0, "progress": len(PROGRESS_FEATURES),
                 "queue": queue_window * len(QUEUE_FEATURES), "queue_prefix": queue_window * width,
                 "running": running_slots * len(RUNNING_FEATURES)}
        bounds = dict(zip(sizes, np.cumsum(list(sizes.values())).tolist(), strict=True))
        self._ends = bounds
        """Each key's end offset in the flat buffer (keys in sorted order; a key's start is the previous end)."""
        self.size = bounds["running"]

    def reset(self, cluster: Cluster) -> None:
        """Start an episode: read the per-episode constants (each container's own, for a pool of several profiles:
        the observation describes the container whose decision is due)."""
        engines = cluster.engines
        self._baselines = [e.backend.baseline_step_s or 0.0 for e in engines]
        self._capacities = [e.num_kv_blocks * e.block_size for e in engines]
        engine = engines[0]
        self._length_mode = LENGTH_MODE_CODE[engine.config.length_mode]
        log = engine.log  # the episode's, shared by every container: its size and arrival span are fixed now
        self._num_requests = log.num_requests
        self._first_arrival = float(log.arrival_s[0]) if log.num_requests else 0.0
        self._arrival_span = float(log.arrival_s[-1]) - self._first_arrival if log.num_requests else 0.0

    def encode(self, cluster: Cluster) -> dict[str, np.ndarray] | np.ndarray:
        deciding, ends = cluster.deciding, self._ends
        engine = cluster.engines[deciding]
        buf = np.zeros(self.size, dtype=np.float32)
        engine.observe(buf, ends["progress"], ends["queue_prefix"], self.queue_window, self._baselines[deciding],
                       self._capacities[deciding], self._length_mode)
        finished = cluster.observe_pool(buf[ends["engine"] : ends["pool"]])
        buf[ends["prefix"] : ends["progress"]] = self._progress(cluster, finished)
        if self.prefix:
            self._prefix(engine, buf[ends["pool"] : ends["prefix"]], buf[ends["queue"] : ends["queue_prefix"]])
        if self.flat:
            return buf
        if not self.prefix:
            return {"engine": buf[: ends["engine"]], "pool": buf[ends["engine"] : ends["pool"]],
                    "progress": buf[ends["prefix"] : ends["progress"]], "queue": buf[ends["progress"] : ends["queue"]],
                    "running": buf[ends["queue_prefix"] :]}
        start, views = 0, {}
        for key, end in ends.items():
            views[key] = buf[start:end]
            start = end
        return views

    def _prefix(self, engine: Engine, cache: np.ndarray, queue: np.ndarray) -> None:
        """``obs["prefix"]`` and ``obs["queue_prefix"]``: the prefix cache and each visible request's hits."""
        state = engine.prefix_cache
        if state is None:
            return
        cache[0] = engine.cached_free_blocks
        cache[1] = len(state.host) * state.unit_tokens
        engine.queue_cached_tokens(self.queue_window, queue)

    def _progress(self, cluster: Cluster, finished: int) -> tuple[float, float, float, float]:
        """``obs["progress"]``: PROGRESS_SCHEMA's values (the episode's constants read at reset; ``finished``: the
        requests finished so far)."""
        n = self._num_requests
        if not n:
            return 0.0, 0.0, 1.0, 0.0
        return (cluster.time - self._first_arrival, self._arrival_span, cluster.num_arrived / n,
                (n - finished - cluster.num_rejected) / n)
