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
    windows come from disjoint spans, so no test request is ever seen in training).
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

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        return self.replay(_read(str(Path(self.path).resolve())), rng)

    def replay(self, full: RequestSpec, rng: np.random.Generator, kept: np.ndarray | None = None) -> RequestSpec:
        """This replay's requests of the trace ``full`` (already read), their prefix chains and sessions with them.

        ``kept`` (a mask over ``full``'s rows, random windows only) keeps just those rows of a window and counts only
        them toward ``min_requests``; arrivals stay relative to the window's first trace request.
        """
        if self.random_window:
            lo, hi = self.window_rows(full, rng, kept)
            rows = np.arange(lo, hi) if kept is None else lo + np.flatnonzero(kept[lo:hi])
            return full.take(rows, (full.arrival_s[rows] - full.arrival_s[lo]) * self.time_scale)
        if kept is not None:
            raise ValueError("kept needs random_window")
        stop = len(full) if self.max_requests is None else min(len(full), self.start + self.max_requests)
        if self.start >= len(full):
            raise TraceError(f"{self.path}: start={self.start} is past the last of {len(full)} requests")
        rows = np.arange(self.start, stop)
        arrival = (full.arrival_s[rows] - full.arrival_s[self.start]) * self.time_scale
        if self.duration_s is not None:
            rows, arrival = rows[arrival < self.duration_s], arrival[arrival < self.duration_s]
        return full.take(rows, arrival)

    def window_rows(self, full: RequestSpec, rng: np.random.Generator,
                    kept: np.ndarray | None = None) -> tuple[int, int]:
        """The trace rows ``[lo, hi)`` of a window of ``duration_s`` scaled seconds starting at a time drawn
        uniformly within one of ``spans``, redrawn (up to 100 times) while it holds fewer than ``min_requests``
        (rows where the mask ``kept`` is True, when given)."""
        width = self.duration_s / self.time_scale
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
