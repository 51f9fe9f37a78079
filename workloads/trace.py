"""Replay of request traces in the Azure LLM inference format (``TIMESTAMP,ContextTokens,GeneratedTokens``)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from servegym.engine.validation import positive_number
from servegym.workloads.base import RequestSpec

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ValueError):
    """A trace file is malformed; the message names the file, the line and the problem."""


def _parse_time(text: str) -> float:
    """Seconds since the epoch from ``YYYY-MM-DD HH:MM:SS[.fraction]`` (any number of fraction digits)."""
    whole, _, frac = text.strip().partition(".")
    stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
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
    return int(value)


@lru_cache(maxsize=8)
def _read(path: str) -> RequestSpec:
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{path}: line 1: empty file, expected header {','.join(COLUMNS)}")
        header = [h.strip() for h in header]
        if header[:3] != list(COLUMNS):
            raise TraceError(f"{path}: line 1: header {header} does not start with {list(COLUMNS)}")
        times, prompts, outputs = [], [], []
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) < 3:
                raise TraceError(f"{path}: line {line}: expected 3 columns, got {len(row)}")
            try:
                t = _parse_time(row[0])
                prompt = _parse_count(row[1], "ContextTokens")
                output = _parse_count(row[2], "GeneratedTokens")
            except ValueError as err:
                raise TraceError(f"{path}: line {line}: {err}") from None
            if prompt < 1 or output < 1:
                raise TraceError(f"{path}: line {line}: token counts must be >= 1, got {prompt}, {output}")
            if times and t < times[-1]:
                raise TraceError(f"{path}: line {line}: TIMESTAMP goes back in time ({row[0].strip()})")
            times.append(t)
            prompts.append(prompt)
            outputs.append(output)
    if not times:
        raise TraceError(f"{path}: no requests after the header")
    arrival = np.asarray(times) - times[0]
    return RequestSpec(arrival, np.asarray(prompts), np.asarray(outputs))


def bundled_trace(name: str = "azure_llm_2023_code.csv") -> Path:
    """Path of a trace shipped in ``servegym/workloads/data`` (CC-BY-4.0, see its README)."""
    return Path(str(resources.files("servegym.workloads") / "data" / name))


@dataclass(frozen=True)
class TraceWorkload:
    """Replay a trace: arrivals relative to its first request, times multiplied by ``time_scale``.

    ``time_scale < 1`` compresses time (a higher rate), ``> 1`` stretches it. ``start`` skips that many
    requests; ``max_requests`` and ``duration_s`` (in scaled seconds) cut the replay.
    """

    path: str
    time_scale: float = 1.0
    start: int = 0
    max_requests: int | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        positive_number("time_scale", self.time_scale)
        if self.start < 0:
            raise ValueError(f"start must be >= 0, got {self.start}")

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        full = _read(str(Path(self.path).resolve()))
        stop = None if self.max_requests is None else self.start + self.max_requests
        arrival = full.arrival_s[self.start : stop]
        if arrival.size == 0:
            raise TraceError(f"{self.path}: start={self.start} is past the last of {len(full)} requests")
        arrival = (arrival - arrival[0]) * self.time_scale
        keep = slice(None) if self.duration_s is None else arrival < self.duration_s
        sl = slice(self.start, stop)
        return RequestSpec(arrival[keep], full.num_prompt_tokens[sl][keep], full.num_output_tokens[sl][keep])

    def mean_rate(self) -> float:
        spec = self.sample(np.random.default_rng(0))
        span = float(spec.arrival_s[-1]) if len(spec) > 1 else 1.0
        return len(spec) / span if span > 0 else float(len(spec))
