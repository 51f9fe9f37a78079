"""Multi-turn sessions over shared system prompts: a seeded workload with known prefix sharing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servegym.validation import count, expected_requests, non_negative_number, positive_int, positive_number
from servegym.workloads.arrivals import Poisson
from servegym.workloads.base import MAX_TOKENS, PrefixChains, RequestSpec
from servegym.workloads.lengths import LengthDist


def _length_dist(name: str, value: object) -> None:
    if not (callable(getattr(value, "sample", None)) and callable(getattr(value, "mean", None))):
        raise ValueError(f"{name} must be a length distribution (Choice, RangeMix, Empirical), got {value!r}")


@dataclass(frozen=True)
class SessionWorkload:
    """Chat sessions: each turn's prompt holds a shared system prompt and the whole conversation so far.

    Sessions start as a Poisson process of ``session_rate`` per second over ``duration_s`` seconds; each picks one
    of ``num_system_prompts`` system prompts uniformly (each prompt's length is drawn once per episode from
    ``system_prompt_tokens``) and has a number of turns drawn from ``turns``. Turn ``k``'s prompt is the system
    prompt, every earlier turn's user and output tokens, and ``user_tokens`` new tokens; its output length comes
    from ``output``. The first turn arrives when the session starts and turn ``k + 1`` an exponential think time
    (mean ``think_s``) after turn ``k`` *arrives*: a workload cannot know when an answer finishes. Later turns may
    arrive after ``duration_s``; every session is kept whole.

    Prefix-block ids (blocks of ``block_tokens``): a block lying wholly inside the system prompt has that prompt's
    id for its position (shared by every session on it); any other block has an id of its own session and
    position, which turn ``k`` reuses from turn ``k - 1`` exactly when the block lies wholly inside turn
    ``k - 1``'s prompt (the same tokens). Ids never collide across sessions; a chain covers ``ceil(prompt / B)``
    blocks. ``session`` numbers the sessions in order of their start.
    """

    session_rate: float
    """Sessions started per second (Poisson)."""
    duration_s: float
    """Seconds over which sessions start."""
    num_system_prompts: int
    """Distinct system prompts the sessions share."""
    system_prompt_tokens: LengthDist
    """Length of each system prompt (drawn once per episode)."""
    turns: LengthDist
    """Turns per session."""
    user_tokens: LengthDist
    """New user tokens in each turn."""
    output: LengthDist
    """Output tokens of each turn."""
    think_s: float
    """Mean exponential gap between a turn's arrival and the next turn's."""
    block_tokens: int = 16
    """Tokens per prefix block (the engine's KV block size)."""

    def __post_init__(self) -> None:
        positive_number("session_rate", self.session_rate)
        positive_number("duration_s", self.duration_s)
        count("num_system_prompts", self.num_system_prompts, "requests")
        for name in ("system_prompt_tokens", "turns", "user_tokens", "output"):
            _length_dist(name, getattr(self, name))
        non_negative_number("think_s", self.think_s)
        positive_int("block_tokens", self.block_tokens)
        if self.block_tokens > MAX_TOKENS:
            raise ValueError(f"block_tokens must be at most {MAX_TOKENS:,}, got {self.block_tokens:,}")
        expected_requests("session_rate x mean turns", self.mean_rate(), self.duration_s)  # before anything is drawn

    def mean_rate(self) -> float:
        """Requests per second: sessions per second times mean turns."""
        return self.session_rate * self.turns.mean()

    def sample(self, rng: np.random.Generator) -> RequestSpec:
        system_tokens = self.system_prompt_tokens.sample(rng, self.num_system_prompts).astype(np.int64)
        starts = Poisson(self.session_rate).sample(rng, self.duration_s)
        sessions = starts.size
        system = rng.integers(0, self.num_system_prompts, size=sessions)
        turns = self.turns.sample(rng, sessions).astype(np.int64)
        n = int(turns.sum())
        user = self.user_tokens.sample(rng, n).astype(np.int64)
        output = self.output.sample(rng, n).astype(np.int64)
        think = rng.exponential(self.think_s, n) if self.think_s > 0 else np.zeros(n)

        of = np.repeat(np.arange(sessions), turns)  # each request's session
        first = np.concatenate([[0], np.cumsum(turns)])[:-1][of]  # the row of its session's first turn
        think[first] = 0.0
        elapsed = np.cumsum(think)
        arrival = starts[of] + (elapsed - elapsed[first])
        said = np.cumsum(user + output) - (user + output)  # tokens of all earlier requests, then of earlier turns
        prompt = system_tokens[system[of]] + (said - said[first]) + user
        if n and prompt.max() > MAX_TOKENS:
            raise ValueError(f"a session's prompt grew to {prompt.max():,} tokens, more than {MAX_TOKENS:,}; use "
                             "fewer or shorter turns")

        block = self.block_tokens
        system_blocks = system_tokens // block
        system_first = np.concatenate([[0], np.cumsum(system_blocks)])  # prompt u's ids: system_first[u] + position
        next_id, chains, ids = int(system_first[-1]), [], np.zeros(0, dtype=np.int64)
        for row, tokens in enumerate(prompt.tolist()):
            if row == first[row]:  # a session starts: its blocks wholly inside the system prompt
                u = int(system[of[row]])
                ids, kept = np.arange(system_first[u], system_first[u + 1]), int(system_blocks[u])
            else:  # the blocks wholly inside the previous turn's prompt
                kept = int(prompt[row - 1]) // block
            fresh = -(-tokens // block) - kept
            ids = np.concatenate([ids[:kept], np.arange(next_id, next_id + fresh)])
            next_id += fresh
            chains.append(ids)
        lengths = np.array([c.size for c in chains], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        hashes = np.concatenate(chains).astype(np.int64) if chains else np.zeros(0, dtype=np.int64)
        order = np.argsort(arrival, kind="stable")
        return RequestSpec(arrival[order], prompt[order], output[order],
                           PrefixChains(offsets, hashes, block).take(order), of[order])
