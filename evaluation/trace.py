"""An episode's life as spans, and as a Trace Event Format file that Perfetto and Chrome's trace viewer open.

:func:`request_spans` splits every arrived request's life, from its arrival to its finish (or the episode's
end), into consecutive phases that tile it:

- ``waiting``: from arrival to first admission (to the end, if never admitted);
- ``prefill``: from admission to the end of the step that emitted its first token (every chunk of the prompt;
  the log does not record which steps gave the request a chunk);
- ``decoding``: from the first token to the last token of a decode segment;
- ``preempted``: from the last token before a preemption to the first token after it (requeued, then the prompt
  and the generated tokens recomputed);
- ``resumed``: for a request still running at the end after a preemption, from its last closed segment on (the
  log closes a segment at a preemption or a finish only).

A rejected request has one instant, ``rejected``, at its arrival. :func:`trace_events` adds one track per
container whose spans are its iterations (decode and prefill tokens, requests running and waiting, KV blocks
in use, admissions, preemptions and finishes in the span's args) and counters of KV blocks in use and queue
length. The file's timestamps are simulated seconds written as microseconds (the format's unit), so the
viewer's "1 s" is one simulated second.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from servegym.engine import STEP_INDEX, EpisodeLog, State

PHASES = ("waiting", "prefill", "decoding", "preempted", "resumed")
REQUESTS_PID, CONTAINERS_PID = 1, 2
US = 1e6
"""Trace timestamps are microseconds: one simulated second is 1e6."""


class Span(NamedTuple):
    request: int
    phase: str
    start_s: float
    end_s: float


def _segments(log: EpisodeLog) -> dict[int, list[tuple[float, float]]]:
    """Closed decode segments per request as (first token, last token) times, in order."""
    ends = [np.asarray([row[0] for row in rows]) for rows in log.step_rows]
    out: dict[int, list[tuple[float, float]]] = {}
    for r, first, last in zip(log.seg_req, log.seg_first, log.seg_last, strict=True):
        step_ends = ends[log.container[r]]
        out.setdefault(r, []).append((float(step_ends[first]), float(step_ends[last])))
    return out


def episode_end(log: EpisodeLog) -> float:
    """The latest step end of any container (0 for an episode with no steps)."""
    ends = [rows[-1][0] for rows in log.step_rows if rows]
    return float(max(ends)) if ends else 0.0


def request_spans(log: EpisodeLog, end_s: float | None = None) -> tuple[list[Span], list[int]]:
    """Every arrived request's phases (tiling arrival to finish, or to ``end_s``: by default the last step's
    end) and the rejected requests' ids."""
    end = episode_end(log) if end_s is None else end_s
    segments = _segments(log)
    spans, rejected = [], []
    for r in range(log.num_requests):
        state = State(int(log.state[r]))
        if state == State.PENDING:
            continue
        if state == State.REJECTED:
            rejected.append(r)
            continue
        arrival, admit = float(log.arrival_s[r]), float(log.admit_s[r])
        stop = float(log.finish_s[r]) if state == State.FINISHED else max(end, arrival)
        if math.isnan(admit):
            spans.append(Span(r, "waiting", arrival, stop))
            continue
        spans.append(Span(r, "waiting", arrival, admit))
        t, closed = admit, segments.get(r, [])
        for k, (first, last) in enumerate(closed):
            spans.append(Span(r, "prefill" if k == 0 else "preempted", t, first))
            spans.append(Span(r, "decoding", first, last))
            t = last
        if t < stop or not closed:
            if not closed:
                first = float(log.first_token_s[r])
                if math.isnan(first):
                    spans.append(Span(r, "prefill", t, stop))
                else:
                    spans += [Span(r, "prefill", t, first), Span(r, "decoding", first, stop)]
            else:
                spans.append(Span(r, "resumed" if state in (State.PREFILLING, State.DECODING) else "preempted",
                                  t, stop))
    return spans, rejected


def trace_events(log: EpisodeLog, end_s: float | None = None) -> dict[str, Any]:
    """The episode in Trace Event Format (a JSON object with ``traceEvents``)."""
    spans, rejected = request_spans(log, end_s)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": REQUESTS_PID, "args": {"name": "requests"}},
        {"ph": "M", "name": "process_name", "pid": CONTAINERS_PID, "args": {"name": "containers"}},
    ]
    named = set()
    for span in spans:
        if span.request not in named:
            named.add(span.request)
            events.append({"ph": "M", "name": "thread_name", "pid": REQUESTS_PID, "tid": span.request,
                           "args": {"name": f"request {span.request}"}})
        events.append({"ph": "X", "name": span.phase, "cat": "request", "pid": REQUESTS_PID, "tid": span.request,
                       "ts": span.start_s * US, "dur": (span.end_s - span.start_s) * US,
                       "args": {"prompt_tokens": int(log.num_prompt_tokens[span.request]),
                                "output_tokens": int(log.num_output_tokens[span.request])}})
    for r in rejected:
        events.append({"ph": "i", "name": "rejected", "cat": "request", "pid": REQUESTS_PID, "tid": r, "s": "t",
                       "ts": float(log.arrival_s[r]) * US, "args": {"reason": int(log.reject_reason[r])}})
    for c in range(log.num_containers):
        events.append({"ph": "M", "name": "thread_name", "pid": CONTAINERS_PID, "tid": c,
                       "args": {"name": f"container {c}"}})
        for row in log.steps(c):
            values = {name: float(row[i]) for name, i in STEP_INDEX.items()}
            end, dt = values.pop("end_s"), values.pop("dt_s")
            ran = values["num_decode_tokens"] or values["num_prefill_tokens"]
            events.append({"ph": "X", "name": "iteration" if ran else "idle", "cat": "container",
                           "pid": CONTAINERS_PID, "tid": c, "ts": (end - dt) * US, "dur": dt * US,
                           "args": {k: int(v) for k, v in values.items()}})
            events.append({"ph": "C", "name": f"KV blocks used, container {c}", "pid": CONTAINERS_PID,
                           "ts": end * US, "args": {"used": int(values["num_used_blocks"])}})
            events.append({"ph": "C", "name": f"queue length, container {c}", "pid": CONTAINERS_PID,
                           "ts": end * US, "args": {"waiting": int(values["num_waiting"])}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "servegym", "time": "simulated seconds, written as microseconds",
                          "requests": log.num_requests, "kv_blocks": log.num_kv_blocks,
                          "container_kv_blocks": [int(log.kv_blocks(c)) for c in range(log.num_containers)],
                          "block_size": log.block_size, "phases": list(PHASES)}}


def write_trace(log: EpisodeLog, path: str | Path, end_s: float | None = None) -> Path:
    path = Path(path)
    path.write_text(json.dumps(trace_events(log, end_s)))
    return path
