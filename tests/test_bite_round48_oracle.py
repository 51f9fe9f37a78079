"""The oracle's decision points and episode tails (issue 48, item 9), on a ten-step episode whose returns are
computed by hand.

The env: discrete time (every iteration, idle ones included, takes 1 s; an empty system jumps to the next
arrival in one step), the latency reward (minus requests in the system x seconds), ``max_episode_steps=10``.
Three requests arrive at 0 (each finishes 2 steps after admission), two at 50 (one finishes after 2 steps, one
runs for 100). Three base policies, each acting on its own call count (a watcher is called at every step, so its
count is the step index, and a tail starts from the watcher's count):

- ``early`` admits at calls 0-1 only: -3, -3 (the three finish), 0 (the jump to 50), then the two wait 7 steps
  (-2 each): -20.
- ``late`` admits from call 3 on: three idle ticks (-3 each), -3, -3, the jump (0), -2, -2 (one finishes), -1,
  -1: -21.
- ``never`` admits nothing: ten idle ticks with three waiting: -30.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

from servegym.benchmark.oracle import Budget, plan_episode
from servegym.policies.base import Policy
from tests.conftest import fixed, make

CALLS: list[tuple[str, int, int]] = []
"""Every act of every copy: (label, the copy's serial number, its call count before the call)."""
SERIALS = itertools.count()


class Counting(Policy):
    """Admits every visible slot at calls first..last (its call count, from 0); records each call."""

    name = "counting"

    def __init__(self, label: str, first: int, last: int) -> None:
        self.label, self.first, self.last = label, first, last
        super().__init__()

    def reset(self) -> None:
        self.calls, self.serial = 0, None

    def __deepcopy__(self, memo):
        twin = copy.copy(self)  # labels and counts: a shallow copy is a deep one
        twin.serial = None  # a new copy, numbered at its first call (ids of freed copies are reused)
        return twin

    def act(self, obs):
        if self.serial is None:
            self.serial = next(SERIALS)
        CALLS.append((self.label, self.serial, self.calls))
        admit = self.first <= self.calls <= self.last
        self.calls += 1
        return np.full(obs["queue"].shape[0] // 6, int(admit), dtype=np.int64)


def bases() -> dict[str, Counting]:
    # Listed worst first, so the sweep's best width are not the first bases listed.
    return {"never": Counting("never", 1, 0), "late": Counting("late", 3, 10**9), "early": Counting("early", 0, 1)}


def env():
    workload = fixed([0.0, 0.0, 0.0, 50.0, 50.0], [4] * 5, [2, 2, 2, 2, 100])
    return make(workload, profile="discrete-time", max_episode_steps=10)


def tail_starts() -> dict[str, list[int]]:
    """The step each tail started at, by base: a copy whose first call had a count above 0 (sweeps and watchers
    start at 0)."""
    first: dict[int, tuple[str, int]] = {}
    for label, serial, count in CALLS:
        first.setdefault(serial, (label, count))
    starts: dict[str, list[int]] = {}
    for label, count in first.values():
        if count > 0:
            starts.setdefault(label, []).append(count)
    return {label: sorted(counts) for label, counts in starts.items()}


@pytest.fixture(autouse=True)
def clear_calls():
    CALLS.clear()


def test_the_sweep_returns_by_hand():
    episode = plan_episode(env(), bases(), seed=0, budget=Budget(replans=0))
    assert episode.sweep == {"never": -30.0, "late": -21.0, "early": -20.0}
    assert episode.switches == ("early@0",) and episode.tails == 0 and episode.result.total_reward == -20.0


def test_tails_start_at_rounded_even_points_and_switch_only_up():
    # Three replans over 10 steps: round(k x 10 / 4) for k = 1, 2, 3 = round(2.5), 5, round(7.5) = 2, 5, 8 (Python
    # rounds halves to even). The two best of the sweep (early, late) each play a tail from every point: 6 tails.
    # At step 2 (the three requests of t = 0 done, t = 2) late's tail admits the two at 50 at once: -6 so far,
    # then 0, -2, -2 and five steps of the long one alone (-5): -15, above the plan's -20: the plan switches.
    # early's tail there ties the plan (-20): no switch. From 5 and 8 both tails replay the plan's -15: no switch.
    episode = plan_episode(env(), bases(), seed=0, budget=Budget(replans=3, width=2))
    assert tail_starts() == {"early": [2, 5, 8], "late": [2, 5, 8]}
    assert episode.tails == 6
    assert episode.switches == ("early@0", "late@2")
    assert episode.result.total_reward == -15.0 and episode.result.steps == 10 and episode.result.truncated


def test_the_width_keeps_only_the_best_of_the_sweep():
    # Width 1: only early (the sweep's best) plays tails, and it never beats its own plan: -20, three tails.
    episode = plan_episode(env(), bases(), seed=0, budget=Budget(replans=3, width=1))
    assert tail_starts() == {"early": [2, 5, 8]}
    assert episode.tails == 3 and episode.switches == ("early@0",) and episode.result.total_reward == -20.0


def test_a_point_that_rounds_to_the_reset_is_no_decision_point():
    # 30 replans over 10 steps: round(k x 10 / 31) for k = 1..30 is 0 (k = 1: 0.32), 1, ..., 10. The reset is the
    # sweep itself and step 10 is past the episode, so tails start at 1..9: nine with width 1.
    episode = plan_episode(env(), bases(), seed=0, budget=Budget(replans=30, width=1))
    assert tail_starts() == {"early": list(range(1, 10))}
    assert episode.tails == 9
