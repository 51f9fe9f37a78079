"""Routers: which replica (container) of a pool receives an arriving request.

A router sees a :class:`RouteState`: each replica's load, free KV blocks and the prompt tokens of the arriving
request it already caches, and returns one replica's index. Every router chooses among the replicas where the
request can fit (``fits``; all of them if none can, and it is rejected there), and every tie that its rule leaves
goes to the least loaded of the tied replicas, then to the lowest index.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import NamedTuple

import numpy as np


class Router(StrEnum):
    LEAST_LOADED = "least_loaded"
    """Fewest queued + running requests, warm or not (a cold pick pays a cold start)."""
    ROUND_ROBIN = "round_robin"
    """Replicas in rotation, whatever their load or warmth (one turn per arrival)."""
    WARM_FIRST = "warm_first"
    """ServerlessLLM-style locality: the least loaded container that holds the model (warm or loading);
    a cold one only when none does."""
    LEAST_KV = "least_kv"
    """Most free KV blocks."""
    PREFIX_AFFINITY = "prefix_affinity"
    """Longest cached prefix of the arriving prompt (GPU or host tier); a miss everywhere goes to the least
    loaded (SGLang's cache-aware router, BLIS's prefix-affinity)."""
    KV_AWARE = "kv_aware"
    """Least weighted cost ``prefix_weight * blocks to prefill + load_weight * blocks in use or queued``
    (NVIDIA Dynamo's KV router; llm-d's weighted scorers)."""
    POWER_OF_TWO = "power_of_two"
    """Two distinct replicas drawn at random, the less loaded of them (Mitzenmacher's power of two choices)."""
    AGENT = "agent"
    """No rule: arrivals wait unrouted until :meth:`Cluster.route` places them (the routing env's action)."""


class RouteState(NamedTuple):
    """What a router sees of the replicas when one request arrives (arrays indexed by replica)."""

    load: np.ndarray
    """Queued + running requests."""
    free_blocks: np.ndarray
    """KV blocks not in use (cached prefixes nobody references count as free: they are evicted on demand)."""
    used_blocks: np.ndarray
    """KV blocks in use by running requests."""
    queued_blocks: np.ndarray
    """KV blocks the queued requests' prompts will take, each prompt rounded up to whole blocks (prefix-cache hits
    not subtracted: what they will find cached can change before they are admitted)."""
    cached_tokens: np.ndarray
    """Prompt tokens of the arriving request the replica holds cached (GPU plus host tier; 0 without caching)."""
    fits: np.ndarray
    """Replicas whose KV cache can hold the request at its shortest possible output."""
    holds_model: np.ndarray
    """Replicas that hold the model (warm or loading)."""
    prompt_tokens: int
    block_size: int
    turn: int
    """Arrivals routed so far this episode."""
    prefix_weight: float = 1.0
    load_weight: float = 1.0
    rng: np.random.Generator | None = None
    """The routing stream (``power_of_two`` draws from it)."""


RouteFn = Callable[[RouteState], int]


def _best(state: RouteState, key: np.ndarray, candidates: np.ndarray | None = None) -> int:
    """The candidate (default: every replica that fits) with the least ``key``; ties to the least loaded, then the
    lowest index."""
    allowed = state.fits if candidates is None else candidates
    if not allowed.any():
        allowed = np.ones_like(allowed, dtype=bool)
    key = np.asarray(key, dtype=np.float64)
    tied = allowed & (key == key[allowed].min())
    return int(np.flatnonzero(tied & (state.load == state.load[tied].min()))[0])


def least_loaded(state: RouteState) -> int:
    return _best(state, state.load)


def round_robin(state: RouteState) -> int:
    n = state.load.size
    for k in range(n):  # the turn's replica, or the next one in rotation that fits
        c = (state.turn + k) % n
        if state.fits[c]:
            return c
    return state.turn % n


def warm_first(state: RouteState) -> int:
    warm = state.fits & state.holds_model
    return _best(state, state.load, warm if warm.any() else None)


def least_kv(state: RouteState) -> int:
    return _best(state, -state.free_blocks)


def prefix_affinity(state: RouteState) -> int:
    return _best(state, -state.cached_tokens)  # a miss everywhere: all tie at 0, so the least loaded


def kv_aware(state: RouteState) -> int:
    to_prefill = -(-(state.prompt_tokens - state.cached_tokens) // state.block_size)
    cost = state.prefix_weight * to_prefill + state.load_weight * (state.used_blocks + state.queued_blocks)
    return _best(state, cost)


def power_of_two(state: RouteState) -> int:
    allowed = np.flatnonzero(state.fits) if state.fits.any() else np.arange(state.load.size)
    if allowed.size == 1:
        return int(allowed[0])
    pair = np.zeros(state.load.size, dtype=bool)
    pair[state.rng.choice(allowed, size=2, replace=False)] = True
    return _best(state, state.load, pair)


ROUTERS: dict[Router, RouteFn] = {
    Router.LEAST_LOADED: least_loaded,
    Router.ROUND_ROBIN: round_robin,
    Router.WARM_FIRST: warm_first,
    Router.LEAST_KV: least_kv,
    Router.PREFIX_AFFINITY: prefix_affinity,
    Router.KV_AWARE: kv_aware,
    Router.POWER_OF_TWO: power_of_two,
}
"""Every rule-based router (``Router.AGENT`` has none: the caller routes)."""
