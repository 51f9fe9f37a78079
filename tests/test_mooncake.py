"""Mooncake trace replay: the bundled files, the reader's errors, the session split and the reference hit ratio."""

from __future__ import annotations

import json
import lzma

import numpy as np
import pytest

from servegym.workloads import (
    MooncakeWorkload,
    PrefixChains,
    RequestSpec,
    TraceError,
    make_workload,
    mooncake_trace,
    read_mooncake,
    trace_hit_ratio,
)
from servegym.workloads.base import MAX_TOKENS
from servegym.workloads.scenarios import MOONCAKE_TIME_SCALE, MOONCAKE_WINDOW_S, profile_for


def _spec(prompts: list[int], chains: list[list[int]], block_tokens: int = 4) -> RequestSpec:
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in chains])]).astype(np.int64)
    hashes = np.array([h for c in chains for h in c], dtype=np.int64)
    n = len(prompts)
    return RequestSpec(np.arange(n, dtype=float), prompts, [1] * n, PrefixChains(offsets, hashes, block_tokens))


def _write(tmp_path, rows: list[object], name: str = "trace.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _row(t: int = 0, prompt: int = 600, output: int = 5, hashes: list[int] | None = None) -> dict:
    return {"timestamp": t, "input_length": prompt, "output_length": output,
            "hash_ids": [0, 1] if hashes is None else hashes}


# ---- the reference hit ratio, by hand (B = 4) ----

def test_hit_ratio_caps_hits_below_the_last_prompt_token_and_caches_full_blocks_only():
    spec = _spec([10, 12, 12, 13, 7, 20],
                 [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3, 4], [1, 5], [1]])
    # r0: no hits; caches 10 // 4 = 2 blocks {1, 2} (block 3 is partial).
    # r1: 2 hits (3 is not cached; cap (12-1)//4 = 2 anyway) -> 8; caches {1, 2, 3}.
    # r2: 1, 2, 3 all cached but the cap (12-1)//4 = 2 binds -> 8.
    # r3: cap 12//4 = 3 -> 3 hits -> 12.   r4: cap 6//4 = 1 -> 4.   r5: chain of 1 block (cap 4) -> 4.
    assert trace_hit_ratio(spec) == pytest.approx((0 + 8 + 8 + 12 + 4 + 4) / (10 + 12 + 12 + 13 + 7 + 20))


def test_an_lru_of_two_blocks_evicts_a_chain_tail_first():
    spec = _spec([12, 9, 13], [[1, 2, 3], [1, 2, 3], [1, 2, 3, 9]])
    # Capacity 2: r0 inserts 3, 2, 1 (tail first) and 3 is evicted, leaving {2, 1}: r1 hits 1, 2 (8 tokens; head-
    # first eviction would have left {2, 3} and no hit). r2: 1, 2 hit, 3 is gone -> 8. Unbounded: r2 hits 3 -> 12.
    assert trace_hit_ratio(spec, capacity_blocks=2) == pytest.approx(16 / 34)
    assert trace_hit_ratio(spec) == pytest.approx(20 / 34)
    assert trace_hit_ratio(spec, capacity_blocks=0) == 0.0


def test_a_hit_makes_its_blocks_most_recently_used():
    spec = _spec([8, 8, 5, 8, 9], [[1, 2], [3, 4], [1, 8], [5, 6], [1, 2, 9]])
    # Capacity 4 (LRU first): r0 -> [2, 1]; r1 -> [2, 1, 4, 3]; r2 hits 1 (cap 1) -> 4 tokens, 1 becomes the newest:
    # [2, 4, 3, 1]; r3 -> [.., 1, 6, 5] evicts 2 and 4; r4 hits 1 but not 2 -> 4 tokens.
    assert trace_hit_ratio(spec, capacity_blocks=4) == pytest.approx(8 / 38)
    assert trace_hit_ratio(spec) == pytest.approx(12 / 38)  # unbounded: r4 hits 1, 2


def test_hit_ratio_without_chains_is_zero_and_capacity_is_checked():
    assert trace_hit_ratio(RequestSpec([0.0], [5], [1])) == 0.0
    with pytest.raises(ValueError, match="capacity_blocks"):
        trace_hit_ratio(_spec([8], [[1, 2]]), capacity_blocks=-1)


# ---- the bundled traces ----

def test_the_bundled_conversation_trace_and_its_hit_ratio_from_the_raw_rows():
    rows = [json.loads(line) for line in lzma.decompress(mooncake_trace("conversation").read_bytes()).splitlines()]
    cached, hit, total = set(), 0, 0
    for row in rows:  # the definition, written out on the raw rows: vLLM's cap, full blocks cached, no eviction
        chain, prompt = row["hash_ids"], row["input_length"]
        k = 0
        while k < min(len(chain), (prompt - 1) // 512) and chain[k] in cached:
            k += 1
        hit, total = hit + 512 * k, total + prompt
        cached.update(chain[: prompt // 512])
    assert hit / total == pytest.approx(0.3734, abs=0.0005)

    spec = MooncakeWorkload("conversation").read()
    assert len(spec) == len(rows) == 12_031
    assert round(float(spec.num_prompt_tokens.mean())) == 12_035
    assert spec.prefix.block_tokens == 512
    assert spec.prefix.chain(1).tolist() == rows[1]["hash_ids"] and spec.prefix.chain(12_030).tolist() == \
        rows[-1]["hash_ids"]
    assert spec.arrival_s[-1] == pytest.approx((rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000)
    assert len(np.unique(spec.session)) == 7_373  # hash_ids[1]: one per conversation
    assert trace_hit_ratio(spec) == pytest.approx(hit / total, abs=1e-12)


def test_the_bundled_synthetic_trace_keys_sessions_on_the_first_block():
    spec = MooncakeWorkload("synthetic").read()
    assert len(spec) == 3_993 and len(np.unique(spec.session)) == 2_211


def test_mooncake_scenarios_are_registered_on_the_large_cache():
    for name in ("mooncake-conversation", "mooncake-conversation-test", "mooncake-synthetic", "shared-prefix"):
        assert profile_for(name) == "a100-llama3-8b"
    train = make_workload("mooncake-conversation")
    assert (train.time_scale, train.duration_s) == (MOONCAKE_TIME_SCALE, MOONCAKE_WINDOW_S)
    assert train.spans == ((0.0, 0.35), (0.65, 1.0)) and make_workload("mooncake-conversation-test").spans == \
        ((0.35, 0.65),)


# ---- the reader ----

def test_reader_times_sessions_and_chains(tmp_path):
    path = _write(tmp_path, [_row(1000, 600, 3, [0, 7]), _row(1500, 300, 4, [0]), "",
                             _row(2500, 1100, 5, [0, 7, 9]), _row(2500, 700, 6, [0, 8])])
    spec = read_mooncake(path)
    np.testing.assert_allclose(spec.arrival_s, [0.0, 0.5, 1.5, 1.5])
    assert spec.num_prompt_tokens.tolist() == [600, 300, 1100, 700]
    assert spec.num_output_tokens.tolist() == [3, 4, 5, 6]
    assert spec.prefix.offsets.tolist() == [0, 2, 3, 6, 8] and spec.prefix.hashes.tolist() == [0, 7, 0, 0, 7, 9, 0, 8]
    assert spec.session.tolist() == [0, 1, 0, 2]  # hash_ids[1]; the one-block request is a session of its own
    assert read_mooncake(path, 0).session.tolist() == [0, 0, 0, 0]  # everyone shares block 0


def test_reader_reads_xz(tmp_path):
    plain = _write(tmp_path, [_row(0), _row(5, 513, 1, [0, 2])])
    packed = tmp_path / "trace.jsonl.xz"
    packed.write_bytes(lzma.compress((tmp_path / "trace.jsonl").read_bytes()))
    a, b = read_mooncake(plain), read_mooncake(str(packed))
    assert a.prefix.hashes.tolist() == b.prefix.hashes.tolist() and a.arrival_s.tolist() == b.arrival_s.tolist()
    bad = tmp_path / "bad.jsonl.xz"
    bad.write_bytes(b"not xz at all")
    with pytest.raises(TraceError, match=r"bad\.jsonl\.xz: not a readable xz file"):
        read_mooncake(str(bad))


@pytest.mark.parametrize(("line", "message"), [
    ('{"timestamp": 1, "input_length": 5', "bad JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({"timestamp": 1, "input_length": 5, "output_length": 1}, "missing field 'hash_ids'"),
    (_row(prompt=12.5), "input_length must be an integer"),
    (_row(prompt=True), "input_length must be an integer"),
    (_row(output=0), r"output_length must be in \[1,"),
    (_row(prompt=MAX_TOKENS + 1), r"input_length must be in \[1,"),
    (_row(t=-1), "timestamp goes back in time"),
    (_row(t="soon"), "timestamp must be a finite number"),
    (_row(prompt=512, hashes=[0, 1]), "hash_ids has 2 blocks, more than the 1"),
    (_row(hashes=[0, -3]), "hash_ids must be integers"),
    (_row(hashes={"a": 1}), "hash_ids must be a list"),
])
def test_a_bad_line_is_named_with_its_file_and_number(tmp_path, line, message):
    path = _write(tmp_path, [_row(0), "", line, _row(9)], name="bad.jsonl")
    with pytest.raises(TraceError, match=rf"bad\.jsonl: line 3: {message}"):
        read_mooncake(path)


def test_an_empty_or_non_utf8_file_is_refused(tmp_path):
    with pytest.raises(TraceError, match="no requests"):
        read_mooncake(_write(tmp_path, ["", " "]))
    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps(_row()).encode() + b"\n\xff\n")
    with pytest.raises(TraceError, match="line 2: not UTF-8"):
        read_mooncake(str(path))


# ---- replay, windows and the session split ----

def test_fixed_replay_of_the_first_requests_keeps_chains_and_sessions():
    full = MooncakeWorkload("conversation").read()
    first = MooncakeWorkload("conversation", time_scale=2.0, max_requests=2000).sample(np.random.default_rng(0))
    assert len(first) == 2000
    np.testing.assert_allclose(first.arrival_s, full.arrival_s[:2000] * 2.0)
    assert first.prefix.hashes.tolist() == full.prefix.hashes[: full.prefix.offsets[2000]].tolist()
    assert first.session.tolist() == full.session[:2000].tolist()
    later = MooncakeWorkload("conversation", start=100, max_requests=5).sample(np.random.default_rng(0))
    assert later.arrival_s[0] == 0.0 and later.prefix.chain(0).tolist() == full.prefix.chain(100).tolist()


def test_windows_are_seeded():
    w = make_workload("mooncake-synthetic")
    a, b, c = (w.sample(np.random.default_rng(s)) for s in (4, 4, 5))
    assert a.arrival_s.tolist() == b.arrival_s.tolist() and a.prefix.hashes.tolist() == b.prefix.hashes.tolist()
    assert a.arrival_s.tolist() != c.arrival_s.tolist()
    assert a.arrival_s[0] >= 0.0 and a.arrival_s[-1] < MOONCAKE_WINDOW_S


def test_no_session_appears_in_both_a_training_and_a_test_window():
    train, test = make_workload("mooncake-conversation"), make_workload("mooncake-conversation-test")
    full = train.read()
    _, first = np.unique(full.session, return_index=True)
    end = full.arrival_s[-1]
    test_sessions = set(np.flatnonzero((full.arrival_s[first] >= 0.35 * end) & (full.arrival_s[first] < 0.65 * end)))
    seen_train, seen_test = set(), set()
    for seed in range(150):
        window = train.sample(np.random.default_rng(seed))
        assert len(window) >= train.min_requests
        seen_train.update(window.session.tolist())
        window = test.sample(np.random.default_rng(10_000 + seed))
        assert len(window) >= test.min_requests
        assert set(window.session.tolist()) <= test_sessions  # a test window holds test sessions only
        seen_test.update(window.session.tolist())
    assert seen_train and seen_test and not seen_train & seen_test
    # Without the rule, windows in the test span would hold later turns of sessions begun in training.
    unfiltered = MooncakeWorkload("conversation", time_scale=MOONCAKE_TIME_SCALE, duration_s=MOONCAKE_WINDOW_S,
                                  random_window=True, spans=((0.0, 1.0),))
    assert any(not set(unfiltered.sample(np.random.default_rng(s)).session.tolist()) <= test_sessions
               for s in range(20))


def test_config_is_checked():
    with pytest.raises(ValueError, match="random_window needs duration_s"):
        MooncakeWorkload(random_window=True)
    with pytest.raises(ValueError, match="spans must be disjoint"):
        MooncakeWorkload(duration_s=10.0, random_window=True, spans=((0.5, 0.2),))
    with pytest.raises(ValueError, match="session_block"):
        MooncakeWorkload(session_block=-1)
    with pytest.raises(ValueError, match="trace must be"):
        MooncakeWorkload("")
    with pytest.raises(ValueError, match="unknown Mooncake trace"):
        mooncake_trace("toolagent")


def test_a_sharded_window_keeps_one_replicas_sessions_and_seeds_pick_different_ones():
    # shards=5: every kept request's session has the same residue mod 5, and over seeds more than one residue is
    # drawn; the unsharded window over the same times holds sessions of several residues.
    from servegym.workloads import MooncakeWorkload, read_mooncake
    from servegym.workloads.mooncake import mooncake_trace

    full = read_mooncake(str(mooncake_trace("conversation")), 1)
    sharded = MooncakeWorkload("conversation", duration_s=600.0, random_window=True, shards=5)
    residues = set()
    for seed in range(8):
        spec = sharded.sample(np.random.default_rng(seed))
        kept = np.unique(spec.session % 5)
        assert kept.size == 1
        residues.add(int(kept[0]))
    assert len(residues) > 1
    whole = MooncakeWorkload("conversation", duration_s=600.0, random_window=True).sample(np.random.default_rng(0))
    assert np.unique(whole.session % 5).size == 5
    assert full.session.max() + 1 == 7373
    with pytest.raises(ValueError, match="shards needs random_window"):
        MooncakeWorkload("conversation", shards=2)
