"""Observation layout shared by the env, hand-coded policies and learned agents."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from servegym.engine.cluster import Cluster
from servegym.engine.engine import RUNNING_OBS_COLUMNS, Engine

ENGINE_FEATURES = (
    "itl_last_s",        # latency of the last iteration that decoded (s)
    "itl_smoothed_s",    # EMA of itl_last_s (weight EngineConfig.itl_smoothing)
    "baseline_step_s",   # the profile's l_min (0 when the backend has none)
    "batch_size",        # running requests (prefilling + decoding)
    "prefilling",        # running requests still ingesting their prompt
    "token_load",        # sum over running requests of (output_hi - generated): remaining-token upper bound
    "queue_depth",       # waiting requests (all of them, not only the visible window)
    "kv_free_frac",      # free KV blocks / all blocks
    "kv_free_delta",     # EMA of the per-step change of kv_free_frac (negative while KV fills)
    "kv_capacity_tokens",  # KV blocks x block size
    "kv_block_size",     # tokens per KV block: a request holds ceil(tokens / block size) blocks
    "last_preempted",    # requests preempted in the last iteration
    "last_admitted",     # requests admitted in the last iteration
    "last_finished",     # requests finished in the last iteration
    "length_mode",       # what output_lo/hi mean: 0 known (exact), 1 predicted (interval), 2 unknown ([1, max])
    "prefill_chunk_tokens",  # most prompt tokens one request ingests per step
    "max_batched_tokens",    # per-step token budget (decodes + prefill chunks)
)
LENGTH_MODE_CODE = {"known": 0, "predicted": 1, "unknown": 2}
QUEUE_FEATURES = ("prompt_tokens", "wait_s", "wait_steps", "output_lo", "output_hi", "generated")
"""Per visible waiting request, queue head first. ``generated`` > 0 marks a preempted request.

Observations are flat (SB3 accepts only 1-D boxes); :func:`queue_matrix` and :func:`running_matrix` give
the row views.
"""

POOL_FEATURES = ("deciding", "warmth", "idle_s", "queue_depth", "running", "kv_free_frac")
"""Per container: 1 for the one whose decision this is; warmth 1 warm, 0 cold, minus seconds left while
loading the model; seconds idle (0 while busy); its queue, batch and free KV fraction."""

ENGINE_INDEX = {name: i for i, name in enumerate(ENGINE_FEATURES)}
POOL_INDEX = {name: i for i, name in enumerate(POOL_FEATURES)}
QUEUE_INDEX = {name: i for i, name in enumerate(QUEUE_FEATURES)}
RUNNING_INDEX = {name: i for i, name in enumerate(RUNNING_OBS_COLUMNS)}


BIG = 1e9
"""Upper bound of unbounded counts, tokens and seconds (finite, so that checkers and normalisers accept it)."""


def observation_space(queue_window: int, running_slots: int, num_containers: int) -> spaces.Dict:
    low = np.zeros(len(ENGINE_FEATURES), dtype=np.float32)
    high = np.full(len(ENGINE_FEATURES), BIG, dtype=np.float32)
    low[ENGINE_INDEX["kv_free_delta"]] = -1.0
    high[ENGINE_INDEX["kv_free_delta"]] = 1.0
    high[ENGINE_INDEX["kv_free_frac"]] = 1.0
    high[ENGINE_INDEX["length_mode"]] = 2.0
    return spaces.Dict({
        "engine": spaces.Box(low, high, dtype=np.float32),
        "queue": spaces.Box(0.0, BIG, (queue_window * len(QUEUE_FEATURES),), dtype=np.float32),
        "running": spaces.Box(0.0, BIG, (running_slots * len(RUNNING_OBS_COLUMNS),), dtype=np.float32),
        "pool": spaces.Box(-BIG, BIG, (num_containers * len(POOL_FEATURES),), dtype=np.float32),
    })


def queue_matrix(obs: dict[str, np.ndarray]) -> np.ndarray:
    """``obs["queue"]`` as a ``(W, len(QUEUE_FEATURES))`` view (a leading batch axis is kept)."""
    q = obs["queue"]
    return q.reshape(*q.shape[:-1], -1, len(QUEUE_FEATURES))


def running_matrix(obs: dict[str, np.ndarray]) -> np.ndarray:
    """``obs["running"]`` as a ``(max_num_seqs, len(RUNNING_OBS_COLUMNS))`` view."""
    r = obs["running"]
    return r.reshape(*r.shape[:-1], -1, len(RUNNING_OBS_COLUMNS))


class ObservationEncoder:
    """Builds observations from an engine; caches the static part of the queue window between changes."""

    def __init__(self, queue_window: int, running_slots: int) -> None:
        self.queue_window = queue_window
        self.running_slots = running_slots
        self._version = -1
        self._queue_static = np.zeros((queue_window, len(QUEUE_FEATURES)), dtype=np.float32)
        self._arrival = np.zeros(0)
        self._enqueue = np.zeros(0)

    def reset(self, engine: Engine) -> None:
        """Start an episode: forget the cached queue and read the per-episode constants."""
        self._version = -1
        self._container = -1
        self._baseline = engine.backend.baseline_step_s or 0.0
        self._capacity = engine.num_kv_blocks * engine.block_size
        self._length_mode = LENGTH_MODE_CODE[engine.config.length_mode.value]
        self._chunk = engine.config.prefill_chunk_tokens
        self._budget = engine.config.max_batched_tokens

    def encode(self, cluster: Cluster) -> dict[str, np.ndarray]:
        engine = cluster.engine
        if engine.queue_version != self._version or engine.container != self._container:
            self._refresh_queue(engine)
        k = self._arrival.size
        queue = self._queue_static.copy()
        if k:
            queue[:k, 1] = engine.clock - self._arrival
            queue[:k, 2] = engine.step_index - self._enqueue
        n = engine.n_running
        running = np.zeros((self.running_slots, len(RUNNING_OBS_COLUMNS)), dtype=np.float32)
        engine.copy_running_into(running)
        last = engine.last
        vector = np.array((
            engine.itl_last, engine.itl_smoothed, self._baseline, n, engine.n_prefilling, engine.token_load,
            engine.queue.size, 1.0 - engine.used_blocks / engine.num_kv_blocks, engine.kv_free_delta,
            self._capacity, engine.block_size, last.preempted, last.admitted, last.finished, self._length_mode,
            self._chunk, self._budget,
        ), dtype=np.float32)
        return {"engine": vector, "queue": queue.reshape(-1), "running": running.reshape(-1),
                "pool": self._pool(cluster)}

    @staticmethod
    def _pool(cluster: Cluster) -> np.ndarray:
        now, values = cluster.time, []
        for e in cluster.engines:
            busy = e.queue.size or e.n_running
            warmth = 1.0 if e.ready_at <= now else (0.0 if e.ready_at == np.inf else now - e.ready_at)
            if cluster.is_cold(e, now):
                warmth = 0.0
            values += (0.0, warmth, 0.0 if busy else now - e.idle_since, e.queue.size, e.n_running,
                       1.0 - e.used_blocks / e.num_kv_blocks)
        pool = np.array(values, dtype=np.float32)
        pool[cluster.deciding * len(POOL_FEATURES)] = 1.0
        return pool

    def _refresh_queue(self, engine: Engine) -> None:
        log = engine.log
        ids = engine.queue[: self.queue_window]
        k = ids.size
        static = self._queue_static
        static[:] = 0.0
        static[:k, 0] = log.prompt[ids]
        static[:k, 3] = log.out_lo[ids]
        static[:k, 4] = log.out_hi[ids]
        static[:k, 5] = log.saved_gen[ids]
        self._arrival = log.arrival_s[ids]
        self._enqueue = log.enqueue_step[ids]
        self._version = engine.queue_version
        self._container = engine.container
