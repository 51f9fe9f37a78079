"""Per-request and per-step records of an episode: plain arrays that metrics read."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


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


STEP_FIELDS = (
    "end_s", "dt_s", "decode_batch", "prefill_rows", "prefill_tokens", "running", "waiting",
    "kv_used_blocks", "admitted", "preempted", "finished", "arrived", "rejected",
)
"""Columns of :attr:`EpisodeLog.steps`, one row per iteration."""


@dataclass
class EpisodeLog:
    """Everything that happened in an episode, as struct-of-arrays over request ids and steps.

    Token times are stored as decode segments: request ``seg_req[k]`` emitted one token at the end of every
    step ``seg_first[k] .. seg_last[k]`` (inclusive). A request has one segment, plus one per preemption.
    """

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    out_lo: np.ndarray
    out_hi: np.ndarray
    truncated: np.ndarray
    num_kv_blocks: int
    block_size: int
    state: np.ndarray = field(init=False)
    admit_s: np.ndarray = field(init=False)
    first_token_s: np.ndarray = field(init=False)
    finish_s: np.ndarray = field(init=False)
    n_preempt: np.ndarray = field(init=False)
    reject_reason: np.ndarray = field(init=False)
    saved_gen: np.ndarray = field(init=False)
    enqueue_step: np.ndarray = field(init=False)
    seg_req: list[int] = field(default_factory=list)
    seg_first: list[int] = field(default_factory=list)
    seg_last: list[int] = field(default_factory=list)
    step_rows: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.arrival_s.size
        self.state = np.full(n, State.PENDING, dtype=np.int8)
        self.admit_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.n_preempt = np.zeros(n, dtype=np.int32)
        self.reject_reason = np.zeros(n, dtype=np.int8)
        self.saved_gen = np.zeros(n, dtype=np.int64)
        self.enqueue_step = np.zeros(n, dtype=np.int64)

    @property
    def num_requests(self) -> int:
        return int(self.arrival_s.size)

    def steps(self) -> np.ndarray:
        """The step log as a float array of shape ``(num_steps, len(STEP_FIELDS))``."""
        if not self.step_rows:
            return np.zeros((0, len(STEP_FIELDS)))
        return np.asarray(self.step_rows, dtype=np.float64)

    def step_column(self, name: str) -> np.ndarray:
        return self.steps()[:, STEP_FIELDS.index(name)]

    def token_times(self, request: int) -> np.ndarray:
        """Emission time of every output token of ``request``, in order."""
        ends = self.step_column("end_s")
        segments = zip(self.seg_req, self.seg_first, self.seg_last, strict=True)
        parts = [ends[first : last + 1] for r, first, last in segments if r == request]
        return np.concatenate(parts) if parts else np.zeros(0)

    def all_token_times(self) -> list[np.ndarray]:
        """Token times of every request (empty for those that emitted none)."""
        ends = self.step_column("end_s")
        out: list[list[np.ndarray]] = [[] for _ in range(self.num_requests)]
        for r, first, last in zip(self.seg_req, self.seg_first, self.seg_last, strict=True):
            out[r].append(ends[first : last + 1])
        return [np.concatenate(p) if p else np.zeros(0) for p in out]

    def counts(self) -> dict[str, int]:
        """Requests per lifecycle bucket; ``arrived = waiting + running + finished + rejected``."""
        per_state = np.bincount(self.state, minlength=len(State))
        return {
            "arrived": int(self.num_requests - per_state[State.PENDING]),
            "waiting": int(per_state[State.WAITING] + per_state[State.PREEMPTED]),
            "running": int(per_state[State.PREFILLING] + per_state[State.DECODING]),
            "finished": int(per_state[State.FINISHED]),
            "rejected": int(per_state[State.REJECTED]),
        }
