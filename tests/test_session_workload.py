"""Multi-turn sessions over shared system prompts: chains by hand, sharing, alignment after sorting, seeding."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from servegym.workloads import Choice, RangeMix, SessionWorkload, make_workload, trace_hit_ratio


@dataclass(frozen=True)
class Cycle:
    """Lengths ``values[0], values[1], ...`` again and again (draws are one call per field, in session order)."""

    values: tuple[int, ...]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.resize(np.asarray(self.values, dtype=np.int64), n)

    def mean(self) -> float:
        return float(np.mean(self.values))


def _two_turns(**changes) -> SessionWorkload:
    fields = dict(session_rate=0.5, duration_s=20.0, num_system_prompts=1, system_prompt_tokens=Cycle((10,)),
                  turns=Choice((2,), (1.0,)), user_tokens=Cycle((3, 7)), output=Cycle((5, 2)), think_s=4.0,
                  block_tokens=4)
    return SessionWorkload(**(fields | changes))


def _by_session(spec):
    """Each session's requests (rows of ``spec``) in turn order."""
    return {int(s): np.flatnonzero(spec.session == s) for s in np.unique(spec.session)}


def test_a_two_turn_session_has_the_chains_computed_by_hand():
    # B = 4, system prompt 10 tokens: blocks 0-1 (ids 0, 1) are wholly system, block 2 straddles its end.
    # Turn 1: 10 + 3 = 13 tokens, 4 blocks: [0, 1, a, b] (b holds token 12 only).
    # Turn 2: 13 + 5 output + 7 user = 25 tokens, 7 blocks: blocks 0-2 lay wholly inside turn 1's 13 tokens and keep
    # their ids; block 3 (tokens 12-15) was partial there, so it is new: [0, 1, a, c, d, e, f].
    # Session s (in start order) takes 6 fresh ids from 2 + 6 s on.
    spec = _two_turns().sample(np.random.default_rng(1))
    sessions = _by_session(spec)
    assert len(sessions) >= 3
    for s, (first, second) in sessions.items():
        a = 2 + 6 * s
        assert spec.prefix.chain(first).tolist() == [0, 1, a, a + 1]
        assert spec.prefix.chain(second).tolist() == [0, 1, a, a + 2, a + 3, a + 4, a + 5]
        assert spec.num_prompt_tokens[[first, second]].tolist() == [13, 25]
        assert spec.num_output_tokens[[first, second]].tolist() == [5, 2]
        assert spec.arrival_s[second] > spec.arrival_s[first]
    # Sessions are numbered by their start, and start as the arrivals of their first turns.
    starts = [spec.arrival_s[rows[0]] for _, rows in sorted(sessions.items())]
    assert starts == sorted(starts) and max(starts) < 20.0
    # Hand hit ratio of the first session's second turn alone, after its first: 3 of 7 blocks, capped at 24 // 4 = 6.
    one = spec.take(sessions[0])
    assert trace_hit_ratio(one) == pytest.approx(3 * 4 / (13 + 25))


def test_a_system_prompt_of_whole_blocks_is_shared_whole():
    spec = _two_turns(system_prompt_tokens=Cycle((8,))).sample(np.random.default_rng(0))
    first, second = _by_session(spec)[0]
    # 8 + 3 = 11 tokens: [0, 1, a]; then 11 + 5 + 7 = 23: blocks 0-1 kept (11 // 4 = 2), a was partial: 4 new.
    assert spec.prefix.chain(first).tolist() == [0, 1, 2]
    assert spec.prefix.chain(second).tolist() == [0, 1, 3, 4, 5, 6]


def test_sessions_on_one_system_prompt_share_exactly_its_blocks():
    w = SessionWorkload(session_rate=3.0, duration_s=30.0, num_system_prompts=3,
                        system_prompt_tokens=Choice((50,), (1.0,)), turns=Choice((1, 2, 3), (0.3, 0.3, 0.4)),
                        user_tokens=RangeMix(((1, 40),), (1.0,)), output=RangeMix(((1, 40),), (1.0,)), think_s=2.0)
    spec = w.sample(np.random.default_rng(7))
    block = w.block_tokens
    blocks = {s: [spec.prefix.chain(r) for r in rows] for s, rows in _by_session(spec).items()}
    system_ids = {s: tuple(chains[0][: 50 // block].tolist()) for s, chains in blocks.items()}  # 3 blocks each
    assert len(set(system_ids.values())) == 3
    everything = {s: {int(h) for c in chains for h in c} for s, chains in blocks.items()}
    sessions = sorted(blocks)
    for i, a in enumerate(sessions):
        for b in sessions[i + 1 :]:
            shared = everything[a] & everything[b]
            assert shared == (set(system_ids[a]) if system_ids[a] == system_ids[b] else set())
    for s, rows in _by_session(spec).items():
        prompts = spec.num_prompt_tokens[rows]
        for k, row in enumerate(rows):
            chain = spec.prefix.chain(row)
            assert chain.size == -(-prompts[k] // block)
            assert tuple(chain[: 50 // block].tolist()) == system_ids[s]
            if k:  # exactly the blocks wholly inside the previous turn's prompt are reused
                before = spec.prefix.chain(rows[k - 1])
                same = prompts[k - 1] // block
                assert chain[:same].tolist() == before[:same].tolist()
                assert not set(chain[same:].tolist()) & set(before.tolist())


def test_requests_are_sorted_with_their_sessions_and_chains():
    spec = _two_turns(session_rate=5.0, think_s=3.0).sample(np.random.default_rng(3))
    assert np.all(np.diff(spec.arrival_s) >= 0)
    assert any(np.any(np.diff(rows) > 1) for rows in _by_session(spec).values())  # turns interleave across sessions
    for rows in _by_session(spec).values():
        assert spec.num_prompt_tokens[rows].tolist() == [13, 25]  # each session's chains moved with its rows
        assert len(spec.prefix.chain(rows[1])) == 7


def test_seeded_reproducibility_and_different_seeds():
    w = make_workload("shared-prefix")
    a, b, c = (w.sample(np.random.default_rng(s)) for s in (11, 11, 12))
    for field in ("arrival_s", "num_prompt_tokens", "num_output_tokens", "session"):
        assert getattr(a, field).tolist() == getattr(b, field).tolist()
    assert a.prefix.hashes.tolist() == b.prefix.hashes.tolist()
    assert a.arrival_s.tolist() != c.arrival_s.tolist()
    assert 0.0 < trace_hit_ratio(a) < 1.0


def test_zero_think_time_sends_every_turn_at_once():
    spec = _two_turns(think_s=0.0).sample(np.random.default_rng(2))
    for first, second in _by_session(spec).values():
        assert spec.arrival_s[first] == spec.arrival_s[second]


@pytest.mark.parametrize(("change", "message"), [
    ({"session_rate": 0.0}, "session_rate"),
    ({"duration_s": -1.0}, "duration_s"),
    ({"num_system_prompts": 0}, "num_system_prompts"),
    ({"turns": 3}, "turns must be a length distribution"),
    ({"think_s": -1.0}, "think_s"),
    ({"block_tokens": 0}, "block_tokens"),
    ({"session_rate": 1e9, "duration_s": 1e6}, "expected requests"),
])
def test_bad_fields_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        _two_turns(**change)


def test_a_prompt_past_the_token_limit_is_refused():
    w = _two_turns(turns=Choice((50,), (1.0,)), user_tokens=Choice((5_000_000,), (1.0,)))
    with pytest.raises(ValueError, match="prompt grew to"):
        w.sample(np.random.default_rng(0))
