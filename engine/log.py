"""Per-request and per-step records of an episode: plain arrays that metrics read."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from servegym.workloads.base import PrefixChains


class State(IntEnum):
    """Request lifecycle. PREEMPTED requests wait in the queue to recompute."""

    PENDING = 0
    WAITING = 1
    PREFILLING = 2
    DECODING = 3
    FINISHED = 4
    REJECTED = 5
    PREEMPTED = 6


class RejectReason(IntEnum):
    NONE = 0
    EXCEEDS_KV_CAPACITY = 1
    """prompt + output tokens exceed the whole KV cache: the request could never finish."""


class StepRow(NamedTuple):
    """One iteration of one container: the fields, in order, of the plain tuples in :attr:`EpisodeLog.step_rows`
    (``StepRow._make(row)`` names them; the garbage collector stops tracking a plain tuple of numbers). The step
    log's columns (:data:`STEP_FIELDS`) are these and ``container``; ``num_running``, ``num_waiting`` and
    ``num_used_blocks`` are that container's after the iteration.
    """

    end_s: float
    """The container's clock when the iteration ended."""
    dt_s: float
    """The iteration's latency (or the idle advance when nothing ran)."""
    num_decode_tokens: int
    """Output tokens emitted: decodes plus the first tokens of prefills that completed."""
    num_prefill_seqs: int
    """Requests that ingested a prompt chunk."""
    num_prefill_tokens: int
    num_running: int
    num_waiting: int
    num_used_blocks: int
    num_admitted: int
    num_preemptions: int
    num_finished: int


STEP_FIELDS = (*StepRow._fields, "container")
"""Columns of :meth:`EpisodeLog.steps`: :class:`StepRow`'s fields and the container that ran the step."""
STEP_INDEX = {name: i for i, name in enumerate(STEP_FIELDS)}


@dataclass
class EpisodeLog:
    """Everything that happened in an episode, as struct-of-arrays over request ids and steps.

    Token times are stored as decode segments: request ``seg_req[k]`` emitted one token at the end of every
    step ``seg_first[k] .. seg_last[k]`` (inclusive) of its container. A request has one segment, plus one
    per preemption. ``step_rows[c]`` holds container ``c``'s iterations, each a tuple of :class:`StepRow`'s fields.
    """

    arrival_s: np.ndarray
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    """True output lengths (after the ``max_tokens`` cap)."""
    output_lo: np.ndarray
    output_hi: np.ndarray
    truncated: np.ndarray
    num_kv_blocks: int
    block_size: int
    num_containers: int = 1
    prefix: PrefixChains | None = None
    """Each request's prefix-block ids (None: the workload gave none; nothing is shared)."""
    container_kv_blocks: tuple[int, ...] = ()
    """Each container's KV blocks where they differ (a heterogeneous cluster); empty: ``num_kv_blocks`` each."""
    state: np.ndarray = field(init=False)
    admit_s: np.ndarray = field(init=False)
    first_token_s: np.ndarray = field(init=False)
    finish_s: np.ndarray = field(init=False)
    num_preemptions: np.ndarray = field(init=False)
    reject_reason: np.ndarray = field(init=False)
    num_generated_at_preemption: np.ndarray = field(init=False)
    """Output tokens a request had generated when last preempted; it recomputes them on resuming."""
    enqueue_step: np.ndarray = field(init=False)
    container: np.ndarray = field(init=False)
    cold_start: np.ndarray = field(init=False)
    load_wait_s: np.ndarray = field(init=False)
    cached_gpu_tokens: np.ndarray = field(init=False)
    """Prompt tokens a request found cached in GPU memory at its first admission (prefix caching)."""
    cached_host_tokens: np.ndarray = field(init=False)
    """Prompt tokens it found in the host tier at its first admission, copied back instead of recomputed."""
    seg_req: list[int] = field(default_factory=list)
    seg_first: list[int] = field(default_factory=list)
    seg_last: list[int] = field(default_factory=list)
    step_rows: list[list[tuple]] = field(init=False)

    def __post_init__(self) -> None:
        n = self.arrival_s.size
        self.state = np.full(n, State.PENDING, dtype=np.int8)
        self.admit_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.num_preemptions = np.zeros(n, dtype=np.int32)
        self.reject_reason = np.zeros(n, dtype=np.int8)
        self.num_generated_at_preemption = np.zeros(n, dtype=np.int64)
        self.enqueue_step = np.zeros(n, dtype=np.int64)
        self.container = np.full(n, -1, dtype=np.int16)
        self.cold_start = np.zeros(n, dtype=bool)
        self.load_wait_s = np.zeros(n)
        self.cached_gpu_tokens = np.zeros(n, dtype=np.int64)
        self.cached_host_tokens = np.zeros(n, dtype=np.int64)
        self.step_rows = [[] for _ in range(self.num_containers)]

    @property
    def num_requests(self) -> int:
        return int(self.arrival_s.size)

    def steps(self, container: int | None = None) -> np.ndarray:
        """The step log as floats, shape ``(num_steps, len(STEP_FIELDS))``: one container's iterations, or
        (``container=None``) every container's, ordered by end time."""
        chosen = range(self.num_containers) if container is None else [container]
        blocks = [np.asarray(self.step_rows[c], dtype=np.float64).reshape(-1, len(STEP_FIELDS) - 1) for c in chosen]
        rows = np.vstack([np.column_stack([b, np.full(len(b), c)]) for c, b in zip(chosen, blocks, strict=True)])
        return rows if container is not None else rows[np.argsort(rows[:, 0], kind="stable")]

    def token_times(self, request: int) -> np.ndarray:
        """Emission time of every output token of ``request``, in order."""
        return self.all_token_times()[request]

    def all_token_times(self) -> list[np.ndarray]:
        """Token times of every request (empty for those that emitted none)."""
        ends = [np.asarray([row[0] for row in rows]) for rows in self.step_rows]
        out: list[list[np.ndarray]] = [[] for _ in range(self.num_requests)]
        for r, first, last in zip(self.seg_req, self.seg_first, self.seg_last, strict=True):
            out[r].append(ends[self.container[r]][first : last + 1])
        return [np.concatenate(p) if p else np.zeros(0) for p in out]

    def kv_blocks(self, container: np.ndarray) -> np.ndarray | int:
        """The KV blocks of each given container (``num_kv_blocks`` unless the containers differ)."""
        if not self.container_kv_blocks:
            return self.num_kv_blocks
        return np.asarray(self.container_kv_blocks)[np.asarray(container, dtype=np.int64)]

    def counts(self) -> dict[str, int]:
        """Requests per lifecycle bucket: ``num_arrived = num_waiting + num_running + num_finished +
        num_rejected`` (preempted requests count as waiting)."""
        per_state = np.bincount(self.state, minlength=len(State))
        return {
            "num_arrived": int(self.num_requests - per_state[State.PENDING]),
            "num_waiting": int(per_state[State.WAITING] + per_state[State.PREEMPTED]),
            "num_running": int(per_state[State.PREFILLING] + per_state[State.DECODING]),
            "num_finished": int(per_state[State.FINISHED]),
            "num_rejected": int(per_state[State.REJECTED]),
        }
