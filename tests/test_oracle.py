"""The oracle: at or above every base policy on every seed, exactly the best base without replans, a refusal on
a nondeterministic env, and its place on the leaderboard (a reference, the score's 100, the bound line)."""

from __future__ import annotations

import copy
import itertools
import json
import math

import gymnasium as gym
import numpy as np
import pytest

from servegym.benchmark.bench import (
    TEST_TRACK,
    BenchJob,
    BenchRow,
    Entry,
    check_entry,
    make_entries,
    make_jobs,
    play,
    run_job,
)
from servegym.benchmark.board import ORACLE, boards
from servegym.benchmark.leaderboard import bound_line, headroom_line, markdown
from servegym.benchmark.oracle import FROZEN_BASES, TUNED_BASES, Budget, plan_episode
from servegym.envs import TEST_SEEDS
from servegym.evaluation.stats import t_critical
from servegym.policies import make_policy
from servegym.runner import env_profile, make_env

TASK = "memory-tight"
BASES = ("fcfs", "twp", "mc-sf", "priority", "random:rank")
SEEDS = (TEST_SEEDS[0], TEST_SEEDS[6])
PAYS = TEST_SEEDS[6]
"""A seed where switching pays at the budget below (the sweep's best, mc-sf, hands over to random:rank at step 199
and takes back at 398: +59 over the best base)."""


def _bases(env: gym.Env) -> dict:
    bases = {}
    for name in BASES:
        policy = make_policy(name)
        policy.bind_profile(env_profile(env))
        bases[name] = policy
    return bases


@pytest.fixture(scope="module")
def alone() -> dict[tuple[str, int], BenchRow]:
    """Each base's own test-track episode, as the leaderboard plays it."""
    return {(name, seed): run_job(BenchJob(TASK, Entry(name, name), seed)) for name in BASES for seed in SEEDS}


@pytest.mark.parametrize("seed", SEEDS)
def test_the_oracle_is_at_or_above_every_base_policy_on_its_seed(seed, alone):
    env = make_env(task=TASK, split="test", apply_overrides=False)
    episode = plan_episode(env, _bases(env), seed, Budget(replans=6, width=3))
    # The sweep replays each base's own episode on copies of the env, bit for bit...
    assert episode.sweep == {name: alone[name, seed].episode_return for name in BASES}
    # ...and the plan only ever switches up: the oracle is at least the best of them.
    best = max(episode.sweep.values())
    assert episode.result.total_reward >= best
    if seed == PAYS:
        assert len(episode.switches) >= 2 and episode.result.total_reward > best + 50
    assert episode.tails <= 6 * 3
    summary = episode.result.summary  # a real episode: every request accounted for
    assert summary["num_arrived"] == summary["num_finished"] + summary["num_rejected"] + summary["num_unfinished"]


def test_without_replans_the_oracle_is_the_best_base_episode(alone):
    seed = SEEDS[0]
    env = make_env(task=TASK, split="test", apply_overrides=False)
    bases = _bases(env)
    before = copy.deepcopy(bases["twp"].__dict__)
    episode = plan_episode(env, bases, seed, Budget(replans=0))
    winner = max(BASES, key=lambda name: alone[name, seed].episode_return)
    row = alone[winner, seed]
    assert episode.switches == (f"{winner}@0",) and episode.tails == 0
    assert (episode.result.total_reward, episode.result.steps) == (row.episode_return, row.steps)
    assert episode.result.summary["e2e_mean_all_s"] == row.e2e_mean_all_s
    assert bases["twp"].__dict__.keys() == before.keys()  # the caller's policies are not played
    assert all(np.array_equal(np.asarray(v), np.asarray(before[k])) for k, v in bases["twp"].__dict__.items()
               if isinstance(v, (int, float, np.ndarray)))


_CALLS = itertools.count()
"""Global state, outside the env: a deep copy of the env does not copy it."""


class _Noisy(gym.Wrapper):
    """Rewards that depend on a global counter: copies of the env cannot replay them."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward + 1e-3 * next(_CALLS), terminated, truncated, info


def test_a_nondeterministic_env_is_refused():
    env = _Noisy(make_env(task=TASK, split="test", apply_overrides=False))
    with pytest.raises(RuntimeError, match="not deterministic under copy"):
        plan_episode(env, {"fcfs": make_policy("fcfs")}, SEEDS[0], Budget(replans=0))


@pytest.mark.parametrize("bad, message", [({"replans": -1}, "replans must be an integer >= 0"),
                                          ({"replans": 1.5}, "replans must be an integer >= 0"),
                                          ({"width": 0}, "width")])
def test_a_bad_budget_is_an_error(bad, message):
    with pytest.raises(ValueError, match=message):
        Budget(**bad)
    with pytest.raises(ValueError, match=message):
        check_entry(Entry(ORACLE, ORACLE, bad))
    with pytest.raises(ValueError, match=r"oracle: .*depth"):
        check_entry(Entry(ORACLE, ORACLE, {"depth": 2}))
    with pytest.raises(ValueError, match="at least one base"):
        plan_episode(make_env(task=TASK), {}, SEEDS[0])


def test_the_oracles_bases_are_frozen_whoever_else_plays():
    # The bases are the board version's frozen set, not the contestants: adding one (here the tuned scorer) or
    # playing alone changes nothing, so the score's 100 does not move when a contestant joins.
    few = make_entries(["fcfs", "twp", ORACLE])
    (job,) = [j for j in make_jobs([TASK], few, SEEDS[:1], ()) if j.entry.policy == ORACLE]
    # The defaults, then the task's tuned sets frozen with the package (not docs/tuning, which a re-tune changes).
    frozen = json.loads(TUNED_BASES.read_text())["tuned"][TASK]
    assert [e.label for e in job.bases] == [*FROZEN_BASES["admission"],
                                            *(f"{row['policy']} (frozen tuned)" for row in frozen)]
    assert job.track == TEST_TRACK and all(e.params == {} for e in job.bases[: len(FROZEN_BASES["admission"])])
    assert [e.params for e in job.bases[len(FROZEN_BASES["admission"]):]] == [row["params"] for row in frozen]
    assert {row["policy"] for row in frozen} == {"flow-control", "mc-sf", "scorer", "twp"}
    alone = [j for j in make_jobs([TASK], make_entries([ORACLE]), SEEDS[:1], ()) if j.entry.policy == ORACLE]
    assert alone == [job]  # the same job, so the same stored episode
    assert job.entry.params == {"replans": Budget().replans, "width": Budget().width} == {"replans": 16, "width": 8}


@pytest.mark.slow
def test_the_leaderboards_oracle_row_bounds_the_policies_it_planned_over():
    entries = make_entries(["fcfs", "mc-sf", ORACLE])
    rows = [run_job(job) for job in make_jobs([TASK], entries, SEEDS[:1], ())]
    by = {row.policy: row.episode_return for row in rows}
    assert by[ORACLE] >= max(by["fcfs"], by["mc-sf"])
    assert play(make_jobs([TASK], entries, SEEDS[:1], ())[0]).total_reward == by["fcfs"]


def _rows(values: dict[str, tuple[float, float, float]]) -> list[BenchRow]:
    return [BenchRow("relaxed", label, seed, value, 1.0, 1.0, 0.5, 0, False, 10)
            for label, triple in values.items() for seed, value in zip(TEST_SEEDS[:3], triple, strict=True)]


def test_the_oracle_is_a_reference_the_scores_100_and_its_gap_is_paired():
    rows = _rows({"random": (-30, -30, -30), "fcfs": (-20, -22, -24), "sarathi": (-14, -15, -19),
                  ORACLE: (-10, -12, -13)})
    (board,) = boards(rows, {"relaxed": "episode_return"})
    assert board.best.policy == "sarathi" and board.best_heuristic.policy == "sarathi"  # never the oracle
    # Score: 0 = random (-30), 100 = the oracle (-35/3): sarathi (-16) scores 100 (-16 + 30) / (-35/3 + 30).
    assert board.normalized(board.score("sarathi")) == pytest.approx(100 * 14 / (30 - 35 / 3))
    assert board.normalized(board.score(ORACLE)) == pytest.approx(100.0)
    # Oracle minus sarathi per seed: 4, 3, 6 -> +4.33 ± t(2) x 1.528 / sqrt(3).
    half = t_critical(2) * np.std([4, 3, 6], ddof=1) / 3**0.5
    assert f"oracle minus `sarathi`, paired: +4.33, CI [{4.333 - half:.2f}, {4.333 + half:.2f}]" in \
        headroom_line(board)
    assert bound_line(board) == "**Bound:** the oracle is at or above all 3 other test-track policies on every one " \
                                "of their seeds (the best found, not the optimum)."
    assert "**Bound:**" in markdown(rows, rankings={"relaxed": "episode_return"})


def test_a_policy_above_the_oracle_on_one_seed_breaks_the_bound_by_name():
    rows = _rows({"random": (-30, -30, -30), "fcfs": (-20, -22, -24), "sarathi": (-14, -11, -19),
                  ORACLE: (-10, -12, -13)})
    (board,) = boards(rows, {"relaxed": "episode_return"})
    assert bound_line(board) == ("**Oracle beaten:** planned over its frozen bases only, the oracle is not a bound of "
                                 f"this board: `sarathi` on 1 seed ({TEST_SEEDS[1]}).")
    # Without an oracle there is no score's 100 and no bound line.
    (plain,) = boards([r for r in rows if r.policy != ORACLE], {"relaxed": "episode_return"})
    assert plain.anchors[1] is None and bound_line(plain) == ""
    assert all(math.isnan(plain.normalized(s)) for s in plain.scores)
