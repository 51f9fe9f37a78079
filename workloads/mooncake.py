"""Replay of the Mooncake FAST'25 traces: arrivals, lengths, prefix-block hash chains and sessions.

Each line of a Mooncake trace is one request, ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``,
where ``hash_ids`` names the request's 512-token prompt blocks; equal ids are equal prefixes (reusable KV). The
bundled copies (``data/mooncake``, Apache-2.0, see ``data/README.md``) are read straight from their ``.xz`` files.

A trace names no sessions, so a session is read off one block of the chain (``session_block``): in the conversation
trace block 0 is a system prompt every request shares and block 1 starts the conversation, so turns of one
conversation share ``hash_ids[1]``; in the synthetic trace conversations differ from block 0 on. A request whose chain
is too short to have that block is a session of its own.
"""

from __future__ import annotations

import json
import lzma
import math
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from servegym.validation import non_negative_int, optional, positive_int
from servegym.workloads.base import MAX_TOKENS, PrefixChains, RequestSpec
from servegym.workloads.trace import TraceError, TraceWorkload, bundled_trace, episode_tile

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per hash block in the Mooncake traces."""
MOONCAKE_TRACES = {"conversation": "mooncake/conversation_trace.jsonl.xz",
                   "synthetic": "mooncake/synthetic_trace.jsonl.xz"}
"""The bundled traces, by name (paths under ``servegym/workloads/data``)."""
SESSION_BLOCKS = {"conversation": 1, "synthetic": 0}
"""The chain position that identifies a request's session in each bundled trace (see the module docstring)."""
_MAX_HASH = 2**63 - 1


def mooncake_trace(name: str) -> Path:
    """Path of a bundled Mooncake trace: ``"conversation"`` or ``"synthetic"``."""
    if name not in MOONCAKE_TRACES:
        raise ValueError(f"unknown Mooncake trace {name!r}; bundled: {sorted(MOONCAKE_TRACES)}")
    return bundled_trace(MOONCAKE_TRACES[name])


def _lines(path: str) -> list[str]:
    """The file's text lines, decompressed when it is ``.xz``."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        if path.endswith(".xz"):
            data = lzma.decompress(data)
    except lzma.LZMAError as err:
        raise TraceError(f"{path}: not a readable xz file ({err})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise TraceError(f"{path}: line {line}: not UTF-8 text (byte {data[err.start]:#04x}), "
                         "expected a Mooncake JSONL trace") from None
    return text.split("\n")


def _count(row: dict, field: str) -> int:
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an integer, got {value!r}")
    if not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"{field} must be in [1, {MAX_TOKENS:,}], got {value}")
    return value


def _parse(row: object) -> tuple[float, int, int, list[int]]:
    """(time in s, prompt tokens, output tokens, hash ids) of one decoded line; ValueError says what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    missing = [f for f in ("timestamp", "input_length", "output_length", "hash_ids") if f not in row]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    stamp = row["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp):
        raise ValueError(f"timestamp must be a finite number of milliseconds, got {stamp!r}")
    prompt, output = _count(row, "input_length"), _count(row, "output_length")
    hashes = row["hash_ids"]
    if not isinstance(hashes, list):
        raise ValueError(f"hash_ids must be a list, got {type(hashes).__name__}")
    blocks = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if len(hashes) > blocks:
        raise ValueError(f"hash_ids has {len(hashes)} blocks, more than the {blocks} that input_length {prompt} fills")
    for value in hashes:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_HASH:
            raise ValueError(f"hash_ids must be integers in [0, 2**63), got {value!r}")
    return stamp / 1000.0, prompt, output, hashes


def _sessions(hashes: list[list[int]], session_block: int) -> np.ndarray:
    """Session ids 0, 1, ... in order of each session's first request."""
    keys = np.array([h[session_block] if len(h) > session_block else -1 - i for i, h in enumerate(hashes)],
                    dtype=np.int64)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse]


@lru_cache(maxsize=8)
def read_mooncake(path: str, session_block: int = 1) -> RequestSpec:
    """All requests of a Mooncake JSONL trace (``.xz`` or plain): arrivals in seconds from its first request,
    prefix chains of 512-token blocks, and sessions read off chain position ``session_block``.

    Raises :class:`TraceError` naming the file and line of the first malformed request.
    """
    non_negative_int("session_block", session_block)
    times, prompts, outputs, hashes = [], [], [], []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            t, prompt, output, chain = _parse(json.loads(line))
        except json.JSONDecodeError as err:
            raise TraceError(f"{path}: line {number}: bad JSON ({err.msg} at column {err.colno})") from None
        except ValueError as err:
            raise TraceError(f"{path}: line {number}: {err}") from None
        if times and t < times[-1]:
            raise TraceError(f"{path}: line {number}: timestamp goes back in time ({t * 1000:g} ms after "
                             f"{times[-1] * 1000:g} ms)")
        times.append(t)
        prompts.append(prompt)
        outputs.append(output)
        hashes.append(chain)
    if not times:
        raise TraceError(f"{path}: no requests")
    offsets = np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64)
    chains = PrefixChains(offsets, np.fromiter((x for h in hashes for x in h), np.int64, int(offsets[-1])),
                          MOONCAKE_BLOCK_TOKENS)
    arrival = np.asarray(times) - times[0]
    return RequestSpec(arrival, np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64), chains,
                       _sessions(hashes, session_block))


def first_request_in(full: RequestSpec, spans: tuple[tuple[float, float], ...]) -> np.ndarray:
    """A mask over ``full``'s requests: those whose session's first request lies in one of ``spans`` (fractions
    ``[lo, hi)`` of the time range; the last instant belongs to a span ending at 1)."""
    session = np.arange(len(full)) if full.session is None else full.session
    _, first, inverse = np.unique(session, return_index=True, return_inverse=True)
    start, end = full.arrival_s[first], float(full.arrival_s[-1])
    inside = np.zeros(first.size, dtype=bool)
    for lo, hi in spans:  # the bounds TraceWorkload.window_rows puts windows in
        inside |= (start >= end * lo) & ((start < end * hi) | (hi == 1.0))
    return inside[inverse]


@dataclass(frozen=True)
class MooncakeWorkload:
    """Replay a Mooncake trace with its prefix chains and sessions: arrivals relative to the first request (or the
    window's first), times multiplied by ``time_scale``.

    The fields mean what they mean in :class:`~servegym.workloads.trace.TraceWorkload`, which does the replay.
    One rule is added for train/test splits: a session belongs to the span that holds its *first* request, and a
    random window keeps only the requests of sessions that start inside ``spans`` (and counts only those toward
    ``min_requests``), so every session lies wholly on one side of a split. Arrivals stay relative to the window's
    first trace request, kept or not. With ``tiles`` and ``shards``, a tile is one shard of one time tile: the span's
    time tiles times ``shards`` disjoint sets of requests, the seed naming one (:meth:`num_tiles`).
    """

    trace: str = "conversation"
    """``"conversation"``, ``"synthetic"`` (the bundled traces) or the path of a Mooncake JSONL(.xz) file."""
    time_scale: float = 1.0
    """Multiplies every time: ``> 1`` stretches the trace (a lower rate, so one GPU can carry it)."""
    start: int = 0
    """Fixed replay: skip this many requests."""
    max_requests: int | None = None
    """Fixed replay: at most this many requests (e.g. the first 2,000)."""
    duration_s: float | None = None
    """Length of the replay (or of each random window) in scaled seconds."""
    random_window: bool = False
    """Each episode replays a window starting at a time drawn by the episode's generator."""
    min_requests: int = 1
    """With ``random_window``: windows with fewer kept requests are redrawn."""
    spans: tuple[tuple[float, float], ...] = ((0.0, 1.0),)
    """With ``random_window``: parts of the time range (fractions ``(lo, hi)``) that windows and sessions lie in."""
    session_block: int | None = None
    """Chain position whose hash id names the session; None: 0 for ``"synthetic"``, 1 otherwise."""
    shards: int = 1
    """With ``random_window``: keep the sessions of one of ``shards`` replicas (session id mod ``shards``, the
    replica drawn per episode), as one replica of a cluster that routes by session sees its traffic: a share of the
    load at the trace's own pace, every turn of its sessions included."""
    tiles: bool = False
    """With ``random_window`` and one span: replay back-to-back tiles of the span, the seed naming the tile and
    (with ``shards``) the shard, as :attr:`TraceWorkload.tiles` does: episodes of different tiles share no request
    (a session may have turns in two adjacent time tiles)."""

    def __post_init__(self) -> None:
        if not isinstance(self.trace, str) or not self.trace:
            raise ValueError(f"trace must be 'conversation', 'synthetic' or a path, got {self.trace!r}")
        optional(non_negative_int)("session_block", self.session_block)
        positive_int("shards", self.shards)
        if self.shards > 1 and not self.random_window:
            raise ValueError("shards needs random_window")
        object.__setattr__(self, "spans", self._replay().spans)  # TraceWorkload checks the other fields

    @property
    def path(self) -> str:
        """The trace file."""
        return str(mooncake_trace(self.trace)) if self.trace in MOONCAKE_TRACES else self.trace

    def _replay(self) -> TraceWorkload:
        return TraceWorkload(self.path, time_scale=self.time_scale, start=self.start, max_requests=self.max_requests,
                             duration_s=self.duration_s, random_window=self.random_window,
                             min_requests=self.min_requests, spans=self.spans, tiles=self.tiles)

    def read(self) -> RequestSpec:
        """The whole trace (cached)."""
        block = SESSION_BLOCKS.get(self.trace, 1) if self.session_block is None else self.session_block
        return read_mooncake(str(Path(self.path).resolve()), block)

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        full = self.read()
        return self._replay().replay(full, rng, *self._kept_and_tile(full, rng))

    def episode_rows(self, rng: np.random.Generator) -> np.ndarray:
        """The rows of the whole trace (:meth:`read`) that :meth:`sample` replays with ``rng``."""
        full = self.read()
        return self._replay().rows(full, rng, *self._kept_and_tile(full, rng))[0]

    def num_tiles(self) -> int:
        """With ``tiles``: the span's time tiles times ``shards``; tile ``t`` is shard ``t % shards`` of time tile
        ``t // shards``."""
        return self._replay().num_tiles(self.read()) * self.shards

    def _kept_and_tile(self, full: RequestSpec, rng: np.random.Generator) -> tuple[np.ndarray | None, int | None]:
        """The mask of rows a window keeps (its spans' sessions, its shard's) and, with ``tiles``, its time tile."""
        whole = self.spans == ((0.0, 1.0),)
        kept = None if whole or not self.random_window else first_request_in(full, self.spans)
        tile = None
        if self.tiles:
            tile, replica = divmod(episode_tile(rng, self.num_tiles()), self.shards)
            shard = full.session % self.shards == replica
        elif self.shards > 1:
            shard = full.session % self.shards == int(rng.integers(self.shards))
        if self.shards > 1:
            kept = shard if kept is None else kept & shard
        return kept, tile

    def mean_rate(self) -> float:
        spec = self.sample(np.random.default_rng(0))
        span = float(spec.arrival_s[-1]) if len(spec) > 1 else 1.0
        return len(spec) / span if span > 0 else float(len(spec))


def trace_hit_ratio(spec: RequestSpec, capacity_blocks: int | None = None) -> float:
    """The prefix-cache hit ratio of ``spec`` from its hash chains alone: the reference the engine is checked against.

    Requests are taken in arrival order, one at a time (no concurrency). Request ``i`` hits the longest leading run
    of its chain that is cached, at most ``(prompt - 1) // B`` blocks (the block holding the last prompt token is
    always computed, as in vLLM); then the first ``prompt // B`` blocks of its chain (its full blocks) are cached.
    With ``capacity_blocks`` the cache is an LRU of that many blocks: a request's full blocks, hits included, become
    the most recently used, inserted tail first so that the chain's tail is evicted before its head (the order in
    which vLLM frees a request's blocks). Returns hit tokens (hits x ``B``) over prompt tokens; 0 without chains.
    Matching costs time in the chain's length, not the cache's size.
    """
    optional(non_negative_int)("capacity_blocks", capacity_blocks)
    total = int(spec.num_prompt_tokens.sum())
    if spec.prefix is None or total == 0:
        return 0.0
    block = spec.prefix.block_tokens
    hashes, offsets = spec.prefix.hashes.tolist(), spec.prefix.offsets.tolist()
    prompts = spec.num_prompt_tokens.tolist()
    cache: OrderedDict[int, None] | set[int] = set() if capacity_blocks is None else OrderedDict()
    hit_blocks = 0
    for i, prompt in enumerate(prompts):
        chain = hashes[offsets[i] : offsets[i + 1]]
        limit = min(len(chain), (prompt - 1) // block)
        hits = 0
        while hits < limit and chain[hits] in cache:
            hits += 1
        hit_blocks += hits
        full = chain[: prompt // block]
        if capacity_blocks is None:
            cache.update(full)
            continue
        for value in reversed(full):
            cache[value] = None
            cache.move_to_end(value)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hit_blocks * block / total
