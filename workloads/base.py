"""What a workload produces: arrays of arrival times and token lengths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from servegym.validation import COUNT_LIMITS

MAX_TOKENS = COUNT_LIMITS["tokens"][0]
"""The most tokens a request's prompt or output may hold (a larger count is a corrupt file, and would overflow)."""


@dataclass(frozen=True)
class RequestSpec:
    """The requests of one episode, sorted by arrival (struct of arrays)."""

    arrival_s: np.ndarray
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    prefix: PrefixChains | None = None
    """Each request's chain of prefix-block ids (None: no request shares KV with another)."""
    session: np.ndarray | None = None
    """Each request's session id (turns of one conversation share it; None: every request is its own). Any
    train/test split keeps a session on one side."""

    def __post_init__(self) -> None:
        arrival = np.asarray(self.arrival_s, dtype=np.float64)
        prompt = np.asarray(self.num_prompt_tokens)
        output = np.asarray(self.num_output_tokens)
        if not (arrival.ndim == prompt.ndim == output.ndim == 1) or not (
            arrival.size == prompt.size == output.size
        ):
            raise ValueError(
                "arrival_s, num_prompt_tokens and num_output_tokens must be 1-D and of equal length, got shapes "
                f"{arrival.shape}, {prompt.shape}, {output.shape}"
            )
        for name, values in (("num_prompt_tokens", prompt), ("num_output_tokens", output)):
            whole = np.issubdtype(values.dtype, np.integer) or (
                np.all(np.isfinite(values)) and np.all(values == np.round(values))
            )
            if values.size and not whole:
                raise ValueError(f"{name} must be whole numbers (first bad index {_first_bad(values)})")
            if values.size and values.min() <= 0:
                raise ValueError(f"{name} must be >= 1; index {int(np.argmin(values))} is {values.min()}")
            if values.size and values.max() > MAX_TOKENS:
                raise ValueError(f"{name} must be at most {MAX_TOKENS:,} ({COUNT_LIMITS['tokens'][1]}); index "
                                 f"{int(np.argmax(values))} is {values.max():g}")
        if arrival.size:
            if not np.all(np.isfinite(arrival)):
                raise ValueError(f"arrival_s must be finite; index {_first_bad(arrival)} is not")
            if arrival[0] < 0:
                raise ValueError(f"arrival_s must be >= 0, got {arrival[0]}")
            if np.any(np.diff(arrival) < 0):
                raise ValueError(f"arrival_s must be sorted; index {int(np.argmax(np.diff(arrival) < 0)) + 1} is not")
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "num_prompt_tokens", prompt.astype(np.int64))
        object.__setattr__(self, "num_output_tokens", output.astype(np.int64))
        if self.prefix is not None:
            if not isinstance(self.prefix, PrefixChains):
                raise TypeError(f"prefix must be a PrefixChains, got {type(self.prefix).__name__}")
            self.prefix.check(self.num_prompt_tokens)
        if self.session is not None:
            session = np.asarray(self.session)
            if session.shape != arrival.shape or (session.size and session.dtype.kind not in "iu"):
                raise ValueError(f"session must be one integer per request ({arrival.size}), got shape "
                                 f"{session.shape} of {session.dtype}")
            object.__setattr__(self, "session", session.astype(np.int64))

    def take(self, rows: np.ndarray, arrival_s: np.ndarray | None = None) -> RequestSpec:
        """The requests at ``rows`` (ascending), their prefix chains and sessions with them; ``arrival_s``
        replaces their arrival times."""
        rows = np.asarray(rows, dtype=np.int64)
        return RequestSpec(self.arrival_s[rows] if arrival_s is None else arrival_s, self.num_prompt_tokens[rows],
                           self.num_output_tokens[rows], None if self.prefix is None else self.prefix.take(rows),
                           None if self.session is None else self.session[rows])

    def __len__(self) -> int:
        return int(self.arrival_s.size)


@dataclass(frozen=True)
class PrefixChains:
    """Prefix-block ids of each request, as compressed rows: request ``i``'s chain is
    ``hashes[offsets[i]:offsets[i + 1]]``, block ``k`` covering its prompt tokens ``[k*B, (k+1)*B)`` with
    ``B = block_tokens``. Equal ids at the same position mean equal KV (the id stands for the whole prefix up to
    and including its block, as in the Mooncake traces). A chain may be shorter than the prompt (its tail is
    unique to the request), never longer than ``ceil(prompt / B)`` blocks.
    """

    offsets: np.ndarray
    hashes: np.ndarray
    block_tokens: int

    def __post_init__(self) -> None:
        offsets, hashes = np.asarray(self.offsets), np.asarray(self.hashes)
        if isinstance(self.block_tokens, bool) or not isinstance(self.block_tokens, int | np.integer) \
                or self.block_tokens < 1:
            raise ValueError(f"block_tokens must be a positive integer, got {self.block_tokens!r}")
        if offsets.ndim != 1 or offsets.size < 1 or hashes.ndim != 1:
            raise ValueError("offsets must be 1-D with one more entry than requests, hashes 1-D")
        if (offsets.size > 1 and offsets.dtype.kind not in "iu") or (hashes.size and hashes.dtype.kind not in "iu"):
            raise ValueError(f"offsets and hashes must be integers, got {offsets.dtype} and {hashes.dtype}")
        if offsets[0] != 0 or offsets[-1] != hashes.size or np.any(np.diff(offsets) < 0):
            raise ValueError(f"offsets must rise from 0 to len(hashes) ({hashes.size})")
        if hashes.size and hashes.min() < 0:
            raise ValueError(f"prefix-block ids must be >= 0; index {int(np.argmin(hashes))} is {hashes.min()}")
        object.__setattr__(self, "offsets", offsets.astype(np.int64))
        object.__setattr__(self, "hashes", hashes.astype(np.int64))
        object.__setattr__(self, "block_tokens", int(self.block_tokens))

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def chain(self, request: int) -> np.ndarray:
        """Request ``request``'s prefix-block ids."""
        return self.hashes[self.offsets[request] : self.offsets[request + 1]]

    def check(self, prompt: np.ndarray) -> None:
        """Raise ValueError unless there is one chain per request, none longer than its prompt."""
        if len(self) != prompt.size:
            raise ValueError(f"prefix chains for {len(self)} requests, but there are {prompt.size}")
        lengths = np.diff(self.offsets)
        over = lengths > -(-prompt // self.block_tokens)
        if over.any():
            i = int(np.argmax(over))
            raise ValueError(f"request {i}'s prefix chain has {lengths[i]} blocks of {self.block_tokens} tokens, "
                             f"more than its {prompt[i]}-token prompt fills")

    def take(self, rows: np.ndarray) -> PrefixChains:
        """The chains of ``rows``, in that order."""
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        lengths = ends - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        picks = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return PrefixChains(offsets, self.hashes[picks], self.block_tokens)


def _first_bad(values: np.ndarray) -> int:
    bad = ~np.isfinite(values) | (values != np.round(np.nan_to_num(values)))
    return int(np.argmax(bad))


@runtime_checkable
class Workload(Protocol):
    """Anything that yields one episode's requests from a seeded generator."""

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        """Draw an episode. All randomness must come from ``rng``."""
        ...
