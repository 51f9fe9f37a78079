"""Named scenarios run on their own profiles; the headroom report's verdict follows its definition."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest

import servegym
from servegym.benchmark.headroom import HAND_CODED, Headroom, PolicyScore, markdown, measure
from servegym.workloads.scenarios import SCENARIO_PROFILES, profile_for


def _score(policy, e2e, goodput, unfinished=0.0):
    return PolicyScore(policy, {"e2e_mean": (e2e, 0.1), "goodput_rps": (goodput, 0.1), "kv_util_max": (0.5, 0.0),
                                "num_preemptions": (0.0, 0.0), "num_unfinished": (unfinished, 0.0)})


def _headroom(fcfs, best, clairvoyant, unfinished_best=0.0):
    scores = {p: _score(p, fcfs[0] * 1.2, fcfs[1]) for p in HAND_CODED}
    scores["fcfs"] = _score("fcfs", *fcfs)
    scores["twp"] = _score("twp", *best, unfinished=unfinished_best)
    scores["random"] = _score("random", fcfs[0] * 1.5, fcfs[1] * 0.5)
    scores["clairvoyant-greedy"] = _score("clairvoyant-greedy", *clairvoyant)
    return Headroom("x", "a100-llama3-8b", 0.5, scores)


def test_decision_sensitivity_is_a_15_percent_gain_on_latency_or_goodput():
    # FCFS 10 s: a best policy at 8.6 s is 14% better (flat), at 8.4 s 16% better (sensitive).
    assert not _headroom((10.0, 4.0), (8.6, 4.0), (8.9, 4.0)).sensitive
    assert _headroom((10.0, 4.0), (8.4, 4.0), (8.9, 4.0)).sensitive
    # Goodput alone: clairvoyant greedy 4.0 -> 4.64 req/s is +16%.
    assert _headroom((10.0, 4.0), (9.9, 4.0), (9.9, 4.64)).sensitive
    assert not _headroom((10.0, 4.0), (9.9, 4.0), (9.9, 4.56)).sensitive


def test_best_policy_must_finish_every_request():
    # A policy that leaves requests waiting shows a low mean over the finished ones; it cannot be "best".
    room = _headroom((10.0, 4.0), (1.0, 4.0), (9.9, 4.0), unfinished_best=12.0)
    assert room.best.policy != "twp" and not room.sensitive
    gains = room.gain(room.scores["clairvoyant-greedy"])
    assert gains[0] == pytest.approx(0.01) and gains[1] == pytest.approx(0.0)


def test_markdown_names_the_sensitive_and_the_flat():
    text = markdown([_headroom((10.0, 4.0), (8.0, 4.0), (7.0, 5.0)),
                     Headroom("y", "a40-llama2-7b", 1.2, _headroom((10.0, 4.0), (9.9, 4.0), (9.9, 4.0)).scores)], 10)
    assert "**Decision-sensitive:** x. **Flat:** y." in text and "| x | a100-llama3-8b | 0.50 |" in text


def test_markdown_gives_no_verdict_from_fewer_than_three_seeds():
    # Rule (as reproduce and bench): a decision-sensitivity verdict needs 3 seeds; with 2 every row is undetermined.
    rows = [_headroom((10.0, 4.0), (8.0, 4.0), (7.0, 5.0))]
    text = markdown(rows, 2)
    assert "**No verdict:** 2 seeds per policy" in text and "Decision-sensitive:**" not in text
    assert "| undetermined |" in text and "| **decision-sensitive** |" not in text
    assert "| **decision-sensitive** |" in markdown(rows, 3)


def test_scenarios_run_on_their_own_profiles_unless_told_otherwise():
    assert profile_for("medium") == "a100-llama3-8b" == servegym.backends.DEFAULT_PROFILE
    assert profile_for("tight-memory") == SCENARIO_PROFILES["tight-memory"] == "a40-llama2-7b"
    env = gym.make(servegym.ENV_ID, workload="tight-memory")
    assert env.unwrapped.engine.num_kv_blocks == 3321
    env = gym.make(servegym.ENV_ID, workload="tight-memory", profile="a100-llama3-8b")
    assert env.unwrapped.engine.num_kv_blocks == 28181


@pytest.mark.slow
def test_measure_runs_every_policy_on_a_scenario():
    room = measure("low", seeds=2, workers=1)
    assert set(room.scores) == {*HAND_CODED, "random", "clairvoyant-greedy"}
    assert all(not math.isnan(s.mean("e2e_mean")) for s in room.scores.values())
    assert room.profile == "a100-llama3-8b" and 0 < room.load_ratio < 1
