"""The Perfetto trace's per-container tracks (issue 48, item 9), on a two-container episode log written by hand:
track names, each iteration's timestamp and duration, idle against prefill-only iterations, the counters, and
the episode's end taken from the container that ran longest.

Timestamps are simulated seconds written as microseconds; every value below is a multiple of 0.25 s, exact in
binary, so events are compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from servegym.engine import EpisodeLog, State
from servegym.evaluation.trace import CONTAINERS_PID, REQUESTS_PID, episode_end, request_spans, trace_events

US = 1e6
# StepRow fields: end_s, dt_s, decode tokens, prefill seqs, prefill tokens, running, waiting, used blocks, admitted,
# preemptions, finished.
C0_ROWS = [(1.0, 1.0, 1, 1, 4, 1, 0, 1, 1, 0, 0),  # request 0 admitted at 0, its prompt and first token
           (2.0, 1.0, 1, 0, 0, 0, 1, 0, 0, 0, 1)]  # its second token: finished; request 2 waits from 1.0 on
C1_ROWS = [(0.75, 0.25, 0, 0, 0, 0, 1, 0, 0, 0, 0),  # idle: request 1 arrived at 0.5 and waits
           (1.25, 0.5, 0, 1, 64, 1, 0, 4, 1, 0, 0),  # admitted at 0.75: a 64-token chunk, no token (prefill only)
           (2.0, 0.75, 1, 1, 16, 1, 0, 6, 0, 0, 0),  # the last 16 prompt tokens and its first token
           (3.5, 1.5, 1, 0, 0, 1, 0, 6, 0, 0, 0),
           (5.0, 1.5, 1, 0, 0, 0, 0, 0, 0, 0, 1)]  # its third token: finished at 5.0


def two_container_log() -> EpisodeLog:
    """Four requests: 0 on container 0 (finished at 2.0), 1 on container 1 (finished at 5.0), 2 still waiting on
    container 0 (arrived 1.0), 3 rejected on arrival at 1.5 (it could never fit)."""
    n = 4
    log = EpisodeLog(np.array([0.0, 0.5, 1.0, 1.5]), np.array([4, 80, 6, 9000]), np.array([2, 3, 2, 5]),
                     np.array([2, 3, 2, 5]), np.array([2, 3, 2, 5]), np.zeros(n, dtype=bool), 100, 16,
                     num_containers=2)
    log.state[:] = [State.FINISHED, State.FINISHED, State.WAITING, State.REJECTED]
    log.container[:] = [0, 1, 0, -1]
    log.admit_s[:2] = [0.0, 0.75]
    log.first_token_s[:2] = [1.0, 2.0]
    log.finish_s[:2] = [2.0, 5.0]
    log.reject_reason[3] = 1
    log.step_rows[0] = list(C0_ROWS)
    log.step_rows[1] = list(C1_ROWS)
    # Decode segments index each request's own container's iterations: request 0 rows 0-1 of container 0,
    # request 1 rows 2-4 of container 1.
    log.seg_req, log.seg_first, log.seg_last = [0, 1], [0, 2], [1, 4]
    return log


def test_the_episode_ends_with_the_container_that_ran_longest():
    # Container 0's last iteration ends at 2.0, container 1's at 5.0: the episode ends at 5.0.
    log = two_container_log()
    assert episode_end(log) == 5.0
    spans, rejected = request_spans(log)
    assert rejected == [3]
    assert [(s.request, s.phase, s.start_s, s.end_s) for s in spans] == [
        (0, "waiting", 0.0, 0.0), (0, "prefill", 0.0, 1.0), (0, "decoding", 1.0, 2.0),
        # Request 1's token times come from container 1's iterations (ends 0.75, 1.25, 2.0, 3.5, 5.0; rows 2-4).
        (1, "waiting", 0.5, 0.75), (1, "prefill", 0.75, 2.0), (1, "decoding", 2.0, 5.0),
        # Request 2 waits from its arrival to the episode's end, not to container 0's last iteration (2.0).
        (2, "waiting", 1.0, 5.0)]


def container_events(events: list[dict], container: int) -> list[dict]:
    return [e for e in events if e["pid"] == CONTAINERS_PID and e.get("tid") == container and e["ph"] == "X"]


def test_each_container_has_a_named_track_of_its_iterations():
    events = trace_events(two_container_log())["traceEvents"]
    names = [(e["tid"], e["args"]["name"]) for e in events
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == CONTAINERS_PID]
    assert names == [(0, "container 0"), (1, "container 1")]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {REQUESTS_PID: "requests", CONTAINERS_PID: "containers"}
    # An iteration starts at its end minus its duration: container 1's run 0.5-0.75 (idle), 0.75-1.25, 1.25-2.0,
    # 2.0-3.5, 3.5-5.0. Only the first is idle: the second ran a prefill chunk and emitted no token.
    track = container_events(events, 1)
    assert [(e["name"], e["ts"], e["dur"]) for e in track] == [
        ("idle", 0.5 * US, 0.25 * US), ("iteration", 0.75 * US, 0.5 * US), ("iteration", 1.25 * US, 0.75 * US),
        ("iteration", 2.0 * US, 1.5 * US), ("iteration", 3.5 * US, 1.5 * US)]
    assert all(e["cat"] == "container" for e in track)
    assert track[1]["args"] == {"num_decode_tokens": 0, "num_prefill_seqs": 1, "num_prefill_tokens": 64,
                                "num_running": 1, "num_waiting": 0, "num_used_blocks": 4, "num_admitted": 1,
                                "num_preemptions": 0, "num_finished": 0, "container": 1}
    assert [(e["ts"], e["dur"]) for e in container_events(events, 0)] == [(0.0, 1.0 * US), (1.0 * US, 1.0 * US)]


def test_each_container_has_its_own_counters_at_its_iterations_ends():
    events = trace_events(two_container_log())["traceEvents"]
    counters = {}
    for e in events:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append((e["ts"], *e["args"].values()))
    assert counters == {
        "KV blocks used, container 0": [(1.0 * US, 1), (2.0 * US, 0)],
        "queue length, container 0": [(1.0 * US, 0), (2.0 * US, 1)],
        "KV blocks used, container 1": [(0.75 * US, 0), (1.25 * US, 4), (2.0 * US, 6), (3.5 * US, 6), (5.0 * US, 0)],
        "queue length, container 1": [(0.75 * US, 1), (1.25 * US, 0), (2.0 * US, 0), (3.5 * US, 0), (5.0 * US, 0)],
    }


def test_request_tracks_and_the_rejected_instant():
    data = trace_events(two_container_log())
    events = data["traceEvents"]
    waiting = [e for e in events if e["pid"] == REQUESTS_PID and e["ph"] == "X" and e["tid"] == 2]
    assert [(e["name"], e["ts"], e["dur"]) for e in waiting] == [("waiting", 1.0 * US, 4.0 * US)]
    assert waiting[0]["args"] == {"prompt_tokens": 6, "output_tokens": 2}
    (instant,) = [e for e in events if e["ph"] == "i"]
    assert (instant["name"], instant["tid"], instant["ts"], instant["args"]) == ("rejected", 3, 1.5 * US,
                                                                                 {"reason": 1})
    assert data["otherData"]["requests"] == 4 and data["otherData"]["kv_blocks"] == 100
    # An explicit end moves only the unfinished request's last span.
    later = trace_events(two_container_log(), end_s=6.0)["traceEvents"]
    assert [e["dur"] for e in later if e["pid"] == REQUESTS_PID and e["ph"] == "X" and e["tid"] == 2] == [5.0 * US]


def test_an_episode_without_steps_ends_at_zero():
    log = two_container_log()
    log.step_rows = [[], []]
    assert episode_end(log) == 0.0
    log.step_rows = [[], list(C1_ROWS[:2])]
    assert episode_end(log) == pytest.approx(1.25)
