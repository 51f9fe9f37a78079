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

    def __len__(self) -> int:
        return int(self.arrival_s.size)


def _first_bad(values: np.ndarray) -> int:
    bad = ~np.isfinite(values) | (values != np.round(np.nan_to_num(values)))
    return int(np.argmax(bad))


@runtime_checkable
class Workload(Protocol):
    """Anything that yields one episode's requests from a seeded generator."""

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        """Draw an episode. All randomness must come from ``rng``."""
        ...
