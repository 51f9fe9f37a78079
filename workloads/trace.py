"""Replay of request traces in the Azure LLM inference format (``TIMESTAMP,ContextTokens,GeneratedTokens``)."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

from servegym.validation import boolean, non_negative_int, optional, positive_int, positive_number
from servegym.workloads.base import MAX_TOKENS, RequestSpec

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_STAMP = re.compile(r"(?:19|20|21)\d\d-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?")
"""The timestamps the vectorised path parses: datetime64[ns] holds 9 fraction digits and years 1678-2262 (it
overflows silently past them). Others (more digits, other years, unpadded fields) go through ``_parse_time``."""


class TraceError(ValueError):
    """A trace file is malformed; the message names the file, the line and the problem."""


def _parse_time(text: str) -> float:
    """Seconds since the epoch from ``YYYY-MM-DD HH:MM:SS[.fraction]`` (any number of fraction digits), in UTC.

    Traces carry no time zone; reading them as UTC keeps a gap across a daylight-saving change what it was.
    """
    whole, _, frac = text.strip().partition(".")
    stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    if frac and not frac.isdigit():
        raise ValueError(f"bad fractional seconds {frac!r}")
    return stamp + (float("0." + frac) if frac else 0.0)


def _parse_count(text: str, column: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{column} {text!r} is not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{column} {text!r} is not a whole number")
    if not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"{column} must be in [1, {MAX_TOKENS:,}], got {text.strip()}")
    return int(value)


def _text(path: str) -> str:
    """The file as text: UTF-8 with or without a byte-order mark; binary files are refused."""
    with open(path, "rb") as handle:
        data = handle.read()
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise TraceError(f"{path}: line {line}: binary data (a NUL byte), expected a CSV text trace")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise TraceError(f"{path}: line {line}: not UTF-8 text (byte {data[err.start]:#04x}), "
                         "expected a CSV text trace") from None


def _rows(path: str, text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each non-blank row after the checked header."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{path}: line 1: empty file, expected header {','.join(COLUMNS)}")
    header = [h.strip() for h in header]
    if header[:3] != list(COLUMNS):
        raise TraceError(f"{path}: line 1: header {header} does not start with {list(COLUMNS)}")
    for row in reader:
        if row and (row[0].strip() or any(cell.strip() for cell in row[1:])):  # the first cell decides most rows
            if len(row) > len(header):
                raise TraceError(f"{path}: line {reader.line_num}: {len(row)} fields, more than the header's "
                                 f"{len(header)} (an unquoted comma?)")
            yield reader.line_num, row


def _parse_fast(rows: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Times (s since the epoch, UTC), prompt and output tokens of well-formed rows, column by column.

    Returns None at the first thing it does not accept; ``_parse_rows`` then parses (or rejects) row by row.
    The arithmetic matches ``_parse_time`` (whole seconds + fraction), so both give the same floats.
    """
    if not rows or any(len(row) < 3 for row in rows):
        return None
    stamps = [row[0].strip() for row in rows]
    if not all(map(_STAMP.fullmatch, stamps)):
        return None
    try:
        ns = np.array(stamps, dtype="datetime64[ns]").astype(np.int64)  # datetime64 has no time zone: UTC
        counts = np.array([[row[1] for row in rows], [row[2] for row in rows]], dtype=np.float64)
    except ValueError:
        return None
    times = (ns // 10**9).astype(np.float64) + (ns % 10**9) / 1e9
    if (not np.all(np.isfinite(counts)) or np.any(counts != np.round(counts)) or np.any(counts < 1)
            or np.any(counts > MAX_TOKENS) or np.any(np.diff(times) < 0)):
        return None
    prompts, outputs = counts.astype(np.int64)
    return times, prompts, outputs


def _parse_rows(path: str, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row by row: slow, but it names the first bad line."""
    times, prompts, outputs = [], [], []
    for line, row in _rows(path, text):
        if len(row) < 3:
            raise TraceError(f"{path}: line {line}: expected 3 columns, got {len(row)}")
        try:
            t = _parse_time(row[0])
            prompt = _parse_count(row[1], "ContextTokens")
            output = _parse_count(row[2], "GeneratedTokens")
        except ValueError as err:
            raise TraceError(f"{path}: line {line}: {err}") from None
        if times and t < times[-1]:
            raise TraceError(f"{path}: line {line}: TIMESTAMP goes back in time ({row[0].strip()})")
        times.append(t)
        prompts.append(prompt)
        outputs.append(output)
    return np.asarray(times, dtype=np.float64), np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)


@lru_cache(maxsize=8)
def _read(path: str) -> RequestSpec:
    text = _text(path)
    times, prompts, outputs = _parse_fast([row for _, row in _rows(path, text)]) or _parse_rows(path, text)
    if not times.size:
        raise TraceError(f"{path}: no requests after the header")
    return RequestSpec(times - times[0], prompts, outputs)


def episode_tile(rng: np.random.Generator, count: int) -> int:
    """Which of ``count`` tiles an episode replays: its seed mod ``count``, so that ``count`` consecutive seeds
    replay ``count`` different tiles (a test set in which no request appears twice).

    A workload sees only the episode's generator, so the seed is read off it: ``reset(seed=s)`` and
    ``np.random.default_rng(s)`` make a PCG64 generator from ``SeedSequence(s)``, whose entropy is ``s``. A generator
    that has drawn already (a later reset without a seed), or was not made from one integer, draws the tile instead.
    """
    positive_int("count", count)
    bits = rng.bit_generator
    seq = getattr(bits, "seed_seq", None)
    fresh = (isinstance(bits, np.random.PCG64) and isinstance(seq, np.random.SeedSequence)
             and isinstance(seq.entropy, int | np.integer) and not seq.spawn_key
             and np.random.PCG64(seq).state == bits.state)
    return int(seq.entropy) % count if fresh else int(rng.integers(count))


def bundled_trace(name: str = "azure_llm_2023_code.csv") -> Path:
    """Path of a trace shipped in ``servegym/workloads/data`` (CC-BY-4.0, see its README)."""
    return Path(__file__).parent / "data" / name


@dataclass(frozen=True)
class TraceWorkload:
    """Replay a trace: arrivals relative to its first request, times multiplied by ``time_scale``.

    ``time_scale < 1`` compresses time (a higher rate), ``> 1`` stretches it. ``start`` skips that many
    requests; ``max_requests`` and ``duration_s`` (in scaled seconds) cut the replay. With
    ``random_window=True`` each episode replays a window of ``duration_s`` (scaled) seconds that starts at a
    time drawn uniformly from the trace by the episode's generator, so seeds give different episodes; ``spans``
    keeps every window inside one of those parts of the trace's time range (a benchmark's training and test
    windows come from disjoint spans, so no test request is ever seen in training). With ``tiles=True`` the windows
    are not drawn but laid back to back over the one span, and an episode replays the tile its seed names
    (:func:`episode_tile`): a test split whose episodes share no request.
    """

    path: str
    time_scale: float = 1.0
    start: int = 0
    max_requests: int | None = None
    duration_s: float | None = None
    random_window: bool = False
    min_requests: int = 1
    """With ``random_window``: windows holding fewer requests are redrawn (the trace has quiet minutes)."""
    spans: tuple[tuple[float, float], ...] = ((0.0, 1.0),)
    """With ``random_window``: parts of the trace's time range, as fractions ``(lo, hi)``, that every window lies
    within one of; a window's span is drawn in proportion to the room it leaves for a window."""
    tiles: bool = False
    """With ``random_window`` and one span: cut the span into :meth:`num_tiles` back-to-back windows of
    ``duration_s`` from its start (the rest of it unused) and replay tile ``seed mod num_tiles`` of the episode's
    seed. Random windows of a short span overlap (30 random 120 s windows of 1,031 s share requests in 79 of their
    435 pairs), which makes a test set look larger than it is; tiles never do. A tile holding fewer than
    ``min_requests`` requests is an error (a tile cannot be redrawn)."""

    def __post_init__(self) -> None:
        positive_number("time_scale", self.time_scale)
        non_negative_int("start", self.start)
        optional(positive_int)("max_requests", self.max_requests)
        optional(positive_number)("duration_s", self.duration_s)
        boolean("random_window", self.random_window)
        if self.random_window and (self.duration_s is None or self.start or self.max_requests is not None):
            raise ValueError("random_window needs duration_s and neither start nor max_requests")
        positive_int("min_requests", self.min_requests)
        spans = tuple((float(lo), float(hi)) for lo, hi in self.spans)
        if not spans or any(not 0.0 <= lo < hi <= 1.0 for lo, hi in spans) or any(
                a[1] > b[0] for a, b in zip(sorted(spans), sorted(spans)[1:], strict=False)):
            raise ValueError(f"spans must be disjoint fractions 0 <= lo < hi <= 1 of the trace, got {self.spans!r}")
        object.__setattr__(self, "spans", spans)
        if spans != ((0.0, 1.0),) and not self.random_window:
            raise ValueError("spans need random_window")
        boolean("tiles", self.tiles)
        if self.tiles and (not self.random_window or len(spans) != 1):
            raise ValueError("tiles need random_window and exactly one span")

    def read(self) -> RequestSpec:
        """The whole trace (cached)."""
        return _read(str(Path(self.path).resolve()))

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        return self.replay(self.read(), rng)

    def replay(self, full: RequestSpec, rng: np.random.Generator, kept: np.ndarray | None = None,
               tile: int | None = None) -> RequestSpec:
        """This replay's requests of the trace ``full`` (already read), their prefix chains and sessions with them;
        arrivals count from the replay's first trace request (see :meth:`rows`)."""
        rows, origin = self.rows(full, rng, kept, tile)
        return full.take(rows, (full.arrival_s[rows] - full.arrival_s[origin]) * self.time_scale)

    def rows(self, full: RequestSpec, rng: np.random.Generator, kept: np.ndarray | None = None,
             tile: int | None = None) -> tuple[np.ndarray, int]:
        """The rows of ``full`` this replay holds, and the row its arrivals count from.

        ``kept`` (a mask over ``full``'s rows, random windows only) keeps just those rows of a window and counts only
        them toward ``min_requests``; arrivals stay relative to the window's first trace request. ``tile`` (with
        ``tiles``) replays that tile rather than the seed's.
        """
        if self.random_window:
            lo, hi = self.window_rows(full, rng, kept, tile)
            return (np.arange(lo, hi) if kept is None else lo + np.flatnonzero(kept[lo:hi])), lo
        if kept is not None:
            raise ValueError("kept needs random_window")
        stop = len(full) if self.max_requests is None else min(len(full), self.start + self.max_requests)
        if self.start >= len(full):
            raise TraceError(f"{self.path}: start={self.start} is past the last of {len(full)} requests")
        rows = np.arange(self.start, stop)
        if self.duration_s is not None:
            rows = rows[(full.arrival_s[rows] - full.arrival_s[self.start]) * self.time_scale < self.duration_s]
        return rows, self.start

    def episode_rows(self, rng: np.random.Generator) -> np.ndarray:
        """The rows of the whole trace (:meth:`read`) that :meth:`sample` replays with ``rng``."""
        return self.rows(self.read(), rng)[0]

    def num_tiles(self, full: RequestSpec | None = None) -> int:
        """With ``tiles``: how many back-to-back windows of ``duration_s`` fit in the span of ``full`` (None: this
        workload's trace)."""
        if not self.tiles:
            raise ValueError("num_tiles needs tiles=True")
        end = float((self.read() if full is None else full).arrival_s[-1])
        lo, hi = self.spans[0]
        return int(end * (hi - lo) // (self.duration_s / self.time_scale))

    def window_rows(self, full: RequestSpec, rng: np.random.Generator, kept: np.ndarray | None = None,
                    tile: int | None = None) -> tuple[int, int]:
        """The trace rows ``[lo, hi)`` of a window of ``duration_s`` scaled seconds: with ``tiles``, tile ``tile``
        (None: the seed's, :func:`episode_tile`) of the span; else one starting at a time drawn uniformly within
        one of ``spans``, redrawn (up to 100 times) while it holds fewer than ``min_requests`` (rows where the mask
        ``kept`` is True, when given)."""
        width = self.duration_s / self.time_scale
        if tile is not None and not self.tiles:
            raise ValueError("tile needs tiles=True")
        if self.tiles:
            count = self.num_tiles(full)
            if count < 1:
                raise TraceError(f"{self.path}: the span {self.spans[0]} is shorter than a {width:g} s tile")
            tile = episode_tile(rng, count) if tile is None else tile
            if not 0 <= tile < count:
                raise ValueError(f"tile must be in [0, {count}), got {tile}")
            begin = float(full.arrival_s[-1]) * self.spans[0][0] + tile * width
            lo, hi = np.searchsorted(full.arrival_s, [begin, begin + width])
            if (hi - lo if kept is None else np.count_nonzero(kept[lo:hi])) < self.min_requests:
                raise TraceError(f"{self.path}: tile {tile} ({begin:g} s + {width:g} s) holds fewer than "
                                 f"{self.min_requests} requests")
            return int(lo), int(hi)
        bounds = [(float(full.arrival_s[-1]) * lo, float(full.arrival_s[-1]) * hi) for lo, hi in self.spans]
        room = np.array([max(0.0, last - first - width) for first, last in bounds])
        if self.spans != ((0.0, 1.0),) and not room.any():
            raise TraceError(f"{self.path}: every span of {self.spans} is shorter than a {width:g} s window")
        for _ in range(100):
            pick = int(rng.choice(len(bounds), p=room / room.sum())) if len(bounds) > 1 else 0
            first, last = bounds[pick]
            latest = max(first, last - width)
            begin = float(rng.uniform(first, latest)) if latest > first else first
            lo, hi = np.searchsorted(full.arrival_s, [begin, begin + width])
            if (hi - lo if kept is None else np.count_nonzero(kept[lo:hi])) >= self.min_requests:
                break
        else:
            raise TraceError(f"{self.path}: no window of {width:g} s holds {self.min_requests} requests")
        return int(lo), int(hi)

    def mean_rate(self) -> float:
        spec = self.sample(np.random.default_rng(0))
        span = float(spec.arrival_s[-1]) if len(spec) > 1 else 1.0
        return len(spec) / span if span > 0 else float(len(spec))
