"""The parametric scorer's default weights, and gains against a reference of zero (issue 48, item 9).

The scorer's defaults (output weight 1, no ageing, memory target 1.0 whatever the queue) are pinned through its
decisions on a crafted queue where each default changes the answer. Gains: the leaderboard's relative gain and
normalized score, and the scenarios report's goodput gain, when the reference is 0.
"""

from __future__ import annotations

import math

import pytest

from servegym.benchmark.bench import BenchRow
from servegym.benchmark.board import boards
from servegym.benchmark.headroom import Headroom, PolicyScore
from servegym.benchmark.leaderboard import headroom_line
from servegym.envs import ENGINE_INDEX, QUEUE_FEATURES, queue_matrix
from servegym.policies import make_policy
from servegym.runner import make_env
from tests.conftest import fixed, flat_profile

# ---------------------------------------------------------------------------------------------- scorer defaults

QUEUE = [  # slot: prompt, known output, seconds waited
    {"num_prompt_tokens": 10, "output_lo": 100, "output_hi": 100, "wait_s": 1e5},  # 0: A, waited longest
    {"num_prompt_tokens": 60, "output_lo": 20, "output_hi": 20, "wait_s": 0.0},  # 1: B
    {"num_prompt_tokens": 30, "output_lo": 30, "output_hi": 30, "wait_s": 0.0},  # 2: C
]


def scorer_obs(kv_tokens: int):
    """A reset observation of an env with a ``kv_tokens``-token cache (one-token blocks: no rounding slack), known
    lengths, nothing running, and QUEUE written in."""
    env = make_env(workload=fixed([0.0], [4], [5]), profile=flat_profile(num_kv_blocks=kv_tokens, block_size=1),
                   engine={"length_mode": "known"}, queue_window=4)
    obs, _ = env.reset(seed=0)
    rows = queue_matrix(obs)
    rows[:] = 0.0
    for i, row in enumerate(QUEUE):
        rows[i] = [row.get(name, 0.0) for name in QUEUE_FEATURES]
    obs["engine"][ENGINE_INDEX["num_waiting"]] = len(QUEUE)
    return obs


def test_the_default_scores_are_minus_prompt_minus_output_without_ageing():
    # score = -(prompt + 1 x output) + 0 x wait: A -110, B -80, C -60. An output weight of 0.5 would rank A (-60)
    # above B (-70); any ageing would put A, who waited 1e5 s, first.
    scorer = make_policy("scorer")
    assert scorer.scores(scorer_obs(160)).tolist() == [-110.0, -80.0, -60.0]


def test_the_default_memory_target_is_the_whole_cache_whatever_the_queue():
    # target_base 1 + target_slope 0 x tanh(waiting / 32): 1.0 with 3 waiting and with 320.
    scorer = make_policy("scorer")
    obs = scorer_obs(160)
    assert scorer.memory_target(obs) == 1.0
    obs["engine"][ENGINE_INDEX["num_waiting"]] = 320
    assert scorer.memory_target(obs) == 1.0


def test_the_default_scorer_admits_best_first_up_to_a_peak_of_the_whole_cache():
    # Order C, B, A. Peak KV of a prefix at its completion times (tokens current + t while alive):
    #   C alone: 30 + 30 = 60; C, B: at t = 20 C 50 + B 80 = 130; C, B, A: at t = 20 C 50 + B 80 + A 30 = 160.
    # A 160-token cache at target 1.0 takes all three (ranks: C 1, B 2, A 3); a 159-token one two. A target base
    # of 0.99 or a slope of -0.1 (x tanh(3/32) = -0.0093) would leave A out at 160; 1.01 or +0.1 would take A at 159.
    scorer = make_policy("scorer")
    assert scorer.act(scorer_obs(160))[:4].tolist() == [3, 2, 1, 0]
    assert scorer.act(scorer_obs(159))[:4].tolist() == [0, 2, 1, 0]


# ---------------------------------------------------------------------------------------------- zero references


def rows(values: dict[str, float], column: str) -> list[BenchRow]:
    """Three seeds per policy on ``relaxed``, every seed at the policy's value in ``column`` (others fixed)."""
    out = []
    for policy, value in values.items():
        for seed in range(3):
            fields = {"episode_return": -100.0, "goodput_rps": 1.0, "e2e_mean_all_s": 1.0, "ttft_p99_s": 0.5}
            fields[column] = value
            out.append(BenchRow("relaxed", policy, seed, fields["episode_return"], fields["goodput_rps"],
                                fields["e2e_mean_all_s"], fields["ttft_p99_s"], 0, False, 100))
    return out


def test_a_gain_over_a_zero_goodput_is_infinite_and_no_change_is_zero():
    # Goodput (higher is better): FCFS and random 0. twp at 2 gains +inf over both (the task is decision-
    # sensitive); sarathi at 0 gains exactly 0, neither infinite nor NaN.
    (board,) = boards(rows({"random": 0.0, "fcfs": 0.0, "twp": 2.0, "sarathi": 0.0}, "goodput_rps"),
                      {"relaxed": "goodput_rps"})
    fcfs = board.score("fcfs")
    assert board.gain(board.score("twp"), fcfs) == math.inf
    assert board.gain(board.score("sarathi"), fcfs) == 0.0
    assert board.verdict == "decision-sensitive"
    assert "best policy `twp` (2.00; +inf vs random, +inf vs FCFS)" in headroom_line(board)


def test_a_loss_against_a_zero_reference_is_minus_infinity():
    # Latency (lower is better) with a reference of 0 s: 0.5 s is worse, by -inf; the same 0 s is a gain of 0.
    (board,) = boards(rows({"random": 0.5, "fcfs": 0.0, "twp": 0.0}, "e2e_mean_all_s"),
                      {"relaxed": "e2e_mean_all_s"})
    fcfs = board.score("fcfs")
    assert board.gain(board.score("random"), fcfs) == -math.inf
    assert board.gain(board.score("twp"), fcfs) == 0.0
    assert board.verdict == "flat"  # the best (twp) gains +100% over random but 0 over FCFS


def test_a_normalized_score_without_a_span_is_nan():
    # 0 = random, 100 = the oracle; when they tie (both 3.0), every score is undefined, never 0 or +-inf.
    (board,) = boards(rows({"fcfs": 1.0, "oracle": 3.0, "random": 3.0}, "e2e_mean_all_s"),
                      {"relaxed": "e2e_mean_all_s"})
    assert [a.policy for a in board.anchors] == ["random", "oracle"]
    assert all(math.isnan(board.normalized(s)) for s in board.scores)
    # With a span (random 3, oracle 1): FCFS at 2 scores 100 (2 - 3) / (1 - 3) = 50, twp at 4 scores -50.
    (board,) = boards(rows({"fcfs": 2.0, "oracle": 1.0, "random": 3.0, "twp": 4.0}, "e2e_mean_all_s"),
                      {"relaxed": "e2e_mean_all_s"})
    assert board.normalized(board.score("fcfs")) == pytest.approx(50.0, abs=1e-9)
    assert board.normalized(board.score("twp")) == pytest.approx(-50.0, abs=1e-9)


def headroom(goodput: dict[str, float]) -> Headroom:
    scores = {p: PolicyScore(p, {"e2e_mean": (2.0, 0.1), "goodput_rps": (g, 0.0)}) for p, g in goodput.items()}
    return Headroom("s", "profile", 1.0, scores)


def test_the_scenarios_goodput_gain_over_a_zero_fcfs():
    # FCFS serves no request within its SLOs (goodput 0): a policy with goodput 1.5 gains +inf; latency 2.0 vs 2.0
    # is a 0 reduction.
    report = headroom({"fcfs": 0.0, "twp": 1.5})
    assert report.gain(report.scores["twp"]) == (0.0, math.inf)
    positive = headroom({"fcfs": 2.0, "twp": 3.0})  # (3 / 2 - 1): +50%
    assert positive.gain(positive.scores["twp"]) == pytest.approx((0.0, 0.5), abs=1e-12)


def test_no_goodput_against_no_goodput_is_no_gain():
    # Both 0: nothing beats FCFS, so the gain is 0 (as the leaderboard's TaskBoard.gain has it), not +inf, which
    # would mark the scenario decision-sensitive on its own.
    report = headroom({"fcfs": 0.0, "twp": 0.0})
    assert report.gain(report.scores["twp"]) == (0.0, 0.0)

