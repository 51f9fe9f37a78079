"""Automatic prefix caching: which prompt blocks of an engine's KV cache hold reusable prefixes, who holds them,
and the host-memory tier below them. docs/KV_REUSE.md states the model and what it leaves out.

The cache works in *units*: the prefix blocks of the workload's chains (:class:`~servegym.workloads.base.
PrefixChains`, ``unit_tokens`` tokens each, a whole number of the engine's KV blocks). A unit is

- *held* while running requests reference it (``refs[id] > 0``): never evicted;
- *free* when none does (``refs[id] == 0``): still cached, kept in least-recently-used order in ``free`` and
  taken back (evicted) from its oldest end when the engine needs blocks;
- *on the host* after an eviction, when the host tier has room (``host``, least recently used first); a hit there
  is copied back to GPU memory, the copy charged by the engine.

The engine owns the block counts; this class owns identities. Matching a prompt costs time in its number of units
(dictionary lookups), never in the cache's size.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from servegym.workloads.base import PrefixChains


def cacheable_units(prompt: int, target: int, unit: int) -> int:
    """Prefix units a request ingesting ``target`` tokens (its prompt first) may find cached: whole units of its
    prompt only, and never the unit holding the last token to ingest, which is always computed (vLLM's rule)."""
    return min(prompt // unit, (target - 1) // unit)


class PrefixCache:
    """The prefix units of one engine's KV cache (GPU) and of its host tier.

    Args:
        chains: the episode's prefix-block ids per request.
        block_size: the engine's tokens per KV block; a unit must be a whole number of them.
        host_units: units the host tier holds (0: no host tier).
        prompt: each request's prompt tokens, for :meth:`caps` (None: all zero).
    """

    def __init__(self, chains: PrefixChains, block_size: int, host_units: int = 0,
                 prompt: np.ndarray | None = None) -> None:
        if chains.block_tokens % block_size:
            raise ValueError(f"prefix blocks of {chains.block_tokens} tokens are not a whole number of the engine's "
                             f"{block_size}-token KV blocks")
        self.unit_tokens = chains.block_tokens
        self.unit_blocks = chains.block_tokens // block_size
        self.host_units = host_units
        ends = chains.offsets[1:-1].tolist()
        self._chains: list[list[int]] = [part.tolist() for part in np.split(chains.hashes, ends)] if len(chains) \
            else []
        """Each request's chain as a list (made once: lookups run on the per-step path)."""
        tokens = [0] * len(chains) if prompt is None else np.asarray(prompt).tolist()
        self._cap_fresh = [cacheable_units(n, n, self.unit_tokens) for n in tokens]
        self._cap_resumed = [cacheable_units(n, n + 1, self.unit_tokens) for n in tokens]
        """:func:`cacheable_units` of each request before any output, and with output to recompute (any amount:
        the cap is then its whole prompt units)."""
        self.refs: dict[int, int] = {}
        """Every unit in GPU memory (held or free) and how many running requests reference it."""
        self.free: OrderedDict[int, None] = OrderedDict()
        """Units no running request references, least recently used first."""
        self.host: OrderedDict[int, None] = OrderedDict()
        """Units in host memory, least recently used first."""
        self.held: dict[int, list[int]] = {}
        """Each running request's referenced units: a leading run of its chain."""

    def chain(self, request: int) -> list[int]:
        """``request``'s prefix-unit ids (the list itself: do not change it)."""
        return self._chains[request]

    def caps(self) -> tuple[list[list[int]], list[int], list[int]]:
        """Every request's chain, and its :func:`cacheable_units` before any output and with output to recompute
        (made once: the engine's observation reads them for every visible request at every step)."""
        return self._chains, self._cap_fresh, self._cap_resumed

    def acquire(self, request: int, units: int) -> tuple[int, int]:
        """Reference the first ``units`` of ``request``'s chain (each cached: the engine's ``leading_run`` said so).

        Returns ``(revived, loaded)``: units that were free (their blocks are now in use again) and units copied
        in from the host tier (new blocks in use)."""
        held = self._chains[request][:units]
        revived = loaded = 0
        for key in held:
            count = self.refs.get(key)
            if count is None:
                del self.host[key]  # a KeyError here: the unit was never cached
                count = 0
                loaded += 1
            elif count == 0:
                del self.free[key]
                revived += 1
            self.refs[key] = count + 1
        self.held[request] = held
        return revived, loaded

    def register(self, request: int, computed: int) -> None:
        """``request`` has computed its first ``computed`` prompt tokens: each full unit among them joins the cache,
        held by it, in chain order, until one is cached already (that copy stays the request's own)."""
        held = self.held.setdefault(request, [])
        full = computed // self.unit_tokens
        if len(held) >= full:
            return
        for key in self._chains[request][len(held) : full]:
            if key in self.refs:
                return
            self.host.pop(key, None)  # a fresh GPU copy supersedes the host's
            self.refs[key] = 1
            held.append(key)

    def release(self, request: int) -> int:
        """``request`` left the running table: drop its references. Returns the units that became free; they join
        the least-recently-used list tail first, so a chain's tail is evicted before its head (vLLM's order)."""
        freed = 0
        for key in reversed(self.held.pop(request, ())):
            count = self.refs[key] - 1
            self.refs[key] = count
            if count == 0:
                self.free[key] = None
                freed += 1
        return freed

    def evict(self, units: int) -> int:
        """Take back the ``units`` least recently used free units (fewer when fewer are free); each moves to the
        host tier when it has one, pushing out the host's least recently used. Returns the units evicted."""
        evicted = 0
        while evicted < units and self.free:
            key, _ = self.free.popitem(last=False)
            del self.refs[key]
            evicted += 1
            if self.host_units:
                self.host[key] = None
                if len(self.host) > self.host_units:
                    self.host.popitem(last=False)
        return evicted

    def held_units(self, request: int) -> int:
        """Units ``request`` references."""
        held = self.held.get(request)
        return len(held) if held else 0

    def check(self, running: list[int]) -> None:
        """Raise AssertionError unless the reference counts are those of the running requests' held units, no unit
        is both free and held, and the host tier is within its size."""
        if set(self.held) - set(running):
            raise AssertionError(f"requests {sorted(set(self.held) - set(running))} hold units but are not running")
        counts: dict[int, int] = {}
        for request, held in self.held.items():
            if held != self.chain(request)[: len(held)]:
                raise AssertionError(f"request {request} holds units that are not a leading run of its chain")
            for key in held:
                counts[key] = counts.get(key, 0) + 1
        free = {key for key, count in self.refs.items() if count == 0}
        if {k: c for k, c in self.refs.items() if c} != counts or free != set(self.free):
            raise AssertionError("prefix-cache reference counts drifted from the running requests' units")
        if len(self.host) > self.host_units or set(self.host) & set(self.refs):
            raise AssertionError("the host tier overflowed or holds a unit that is in GPU memory")
