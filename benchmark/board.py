"""The leaderboard's Markdown: per task, the policies best-first, and whether the task's decisions matter.

A task is *decision-sensitive* when the best non-reference policy of the test track is at least 15% better than
both random admission and FCFS on the task's ranking metric; otherwise it is *flat* (any sensible policy scores
about the same there). Rows labelled ``<policy> [engine-config]`` ran with the policy's own engine settings (its
chunk size, token budget, eviction rule or true lengths) instead of the task's: they are shown in their own table
and never ranked against, or counted in the headroom of, the test track.

Each test-track row also carries a normalized score, 0 = FCFS and 100 = the oracle of the same run on the task
(:mod:`servegym.benchmark.oracle`, at or above every contestant on every seed; without an oracle on the board,
100 = the best hand-coded heuristic), and the per-seed paired difference to the best heuristic with its 95% CI.
The *bound* line checks the oracle against every test-track row, seed by seed.
Gains are relative to the reference's magnitude and positive when better:
``(value - reference) / |reference|`` where higher is better (the episode return, goodput), the negative of that
where lower is better (latency). For a negative return (minus request-seconds) that is the latency reduction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from servegym.benchmark.oracle import ORACLE
from servegym.envs.tasks import get_task
from servegym.evaluation.stats import MIN_VERDICT_SEEDS, Interval, mean_ci, paired_difference
from servegym.metrics import metric

if TYPE_CHECKING:
    from servegym.benchmark.bench import BenchRow

REFERENCES = ("random", "fcfs", "clairvoyant-greedy", ORACLE)
"""Labels of the reference policies: the floors to beat (random, FCFS), the clairvoyant greedy packer (true
lengths; a comparison point, not a ceiling: tuned policies beat it) and the oracle (the ceiling of the board)."""
ENGINE_CONFIG_SUFFIX = " [engine-config]"
"""Label suffix of the rows a policy ran with its own engine settings instead of the task's."""
INTERRUPTED_MARK = " [interrupted]"
"""Label mark of a trained agent whose training stopped before its timesteps (its ``config.json`` says so): it is
shown and ranked as what it is, an unfinished agent, and never pooled with its finished training seeds."""
VALIDATION_SUFFIX = " [validation]"
"""Label suffix of a heuristic's episodes on the validation seeds, where the best heuristic is chosen."""
UNRANKED_MARK = " [unranked: "
"""Label mark of a tuned parameter set or a trained agent whose data record shows test data, another env version or
no record (:func:`~servegym.benchmark.provenance.unranked_reasons`): shown in its own table, with why, never ranked,
never in the headroom, never a base of the oracle, never the best heuristic."""
FLOORS = {"admission": ("random", "fcfs"), "route": ("router-round-robin", "router-round-robin")}
"""Per task decision (``Task.decision``): the random floor (the normalized score's 0) and the arrival-order rule
(FCFS; a routing task's is round-robin, which is also its decision-blind floor)."""
ROUTING_BASE = "router-round-robin"
"""What a routing task's routers are compared with, seed by seed (:func:`routing_table`)."""
ROUTING_COLUMNS = ("prefix_hit_ratio", "e2e_mean_all_s", "episode_return")
SENSITIVE = 0.15
"""Relative gain over both random and FCFS that makes a task decision-sensitive."""
COLUMN_METRICS = {"episode_return": "episode_return", "goodput_rps": "goodput_rps",
                  "e2e_mean_all_s": "e2e_mean_all_s", "ttft_p99_s": "ttft_p99", "unfinished": "num_unfinished",
                  "prefix_hit_ratio": "prefix_hit_ratio"}
"""``leaderboard.csv``'s score columns (``BenchRow`` fields, kept for the files already written) and the declared
metric each holds (``servegym.metrics.METRICS``: header and direction)."""
METRICS = tuple(COLUMN_METRICS)
HEADERS = tuple(metric(name).header for name in COLUMN_METRICS.values())
LOWER_IS_BETTER = {column: not metric(name).higher_is_better for column, name in COLUMN_METRICS.items()}
"""The metrics a task may rank by (``Task.ranking``), and their direction."""


@dataclass(frozen=True)
class Score:
    """One policy on one task: metric -> (mean, 95% CI half-width) over seeds."""

    policy: str
    metrics: dict[str, tuple[float, float]]
    episodes: int
    truncated: int
    per_seed: dict[int, float]
    """The ranking metric, by seed (for paired differences)."""

    def mean(self, metric: str) -> float:
        return self.metrics[metric][0]


def is_engine_config(label: str) -> bool:
    return label.endswith(ENGINE_CONFIG_SUFFIX)


def is_validation(label: str) -> bool:
    return label.endswith(VALIDATION_SUFFIX)


def is_interrupted(label: str) -> bool:
    """An agent whose training was interrupted (:data:`INTERRUPTED_MARK`)."""
    return INTERRUPTED_MARK in label


def unranked_label(label: str, reasons: Sequence[str]) -> str:
    """``label``, marked :data:`UNRANKED_MARK` with ``reasons`` when there are any."""
    return f"{label}{UNRANKED_MARK}{'; '.join(reasons)}]" if reasons else label


def is_unranked(label: str) -> bool:
    return UNRANKED_MARK in label


def is_reference(label: str) -> bool:
    """A floor or comparison point: random admission, a random floor of an action mode (``random:MODE``), FCFS,
    the clairvoyant packer."""
    return label in REFERENCES or label.startswith("random:")


def is_heuristic(label: str) -> bool:
    """A hand-coded policy of the test track (default or tuned parameters, FCFS included): not an agent and not
    a reference other than FCFS."""
    return not (label.startswith("rl:") or is_engine_config(label) or is_unranked(label)
                or (is_reference(label) and label != "fcfs"))


@dataclass(frozen=True)
class TaskBoard:
    """One task's scores, best first by its ranking metric."""

    task: str
    ranking: str
    scores: tuple[Score, ...]
    """The test track: every policy on exactly the task's settings, best first."""
    engine_config: tuple[Score, ...] = ()
    """Policies on their own engine settings, best first (not ranked against the test track)."""
    unranked: tuple[Score, ...] = ()
    """Tuned parameters and agents whose data record keeps them off the ranking (:data:`UNRANKED_MARK`)."""
    validation: tuple[Score, ...] = ()
    """The heuristics on the validation seeds (labels without :data:`VALIDATION_SUFFIX`), best first."""

    @property
    def lower_is_better(self) -> bool:
        return LOWER_IS_BETTER[self.ranking]

    def score(self, label: str) -> Score | None:
        return next((s for s in self.scores if s.policy == label), None)

    @property
    def best(self) -> Score | None:
        """The best test-track policy that is not a reference."""
        return next((s for s in self.scores if not is_reference(s.policy)), None)

    @property
    def chosen_on_validation(self) -> bool:
        """Whether the best heuristic was chosen on the validation seeds (else, on a board without validation
        rows, on the test seeds themselves: said so on the board)."""
        return any(self.score(v.policy) is not None and is_heuristic(v.policy) for v in self.validation)

    @property
    def best_heuristic(self) -> Score | None:
        """The hand-coded policy of the test track (FCFS and tuned variants included) that is best on the
        validation seeds; the best on the test seeds where no heuristic ran there."""
        for candidate in self.validation:
            if is_heuristic(candidate.policy) and self.score(candidate.policy) is not None:
                return self.score(candidate.policy)
        return next((s for s in self.scores if is_heuristic(s.policy)), None)

    @property
    def floors(self) -> tuple[str, str]:
        """The labels of the random floor and of the arrival-order rule (:data:`FLOORS`)."""
        return FLOORS[get_task(self.task).decision]

    @property
    def anchors(self) -> tuple[Score | None, Score | None]:
        """The normalized score's 0 and 100: the random floor and the oracle."""
        return self.score(self.floors[0]), self.score(ORACLE)

    def normalized_value(self, value: float) -> float:
        """``value`` of the ranking metric on the anchors' scale: 0 = the random floor's mean, 100 = the oracle's;
        NaN when an anchor is missing or they tie."""
        low, high = self.anchors
        if low is None or high is None:
            return math.nan
        span = high.mean(self.ranking) - low.mean(self.ranking)
        return math.nan if span == 0 else 100.0 * ((value - low.mean(self.ranking)) / span)

    def normalized_on_seed(self, score: Score, seed: int) -> float:
        """``score``'s value on ``seed`` against the anchors' values on that same seed (paired: the seed's workload,
        which moves all three, cancels); the anchors' means where they tie or lack the seed."""
        low, high = self.anchors
        value = score.per_seed[seed]
        if low is None or high is None or seed not in low.per_seed or seed not in high.per_seed:
            return self.normalized_value(value)
        span = high.per_seed[seed] - low.per_seed[seed]
        return self.normalized_value(value) if span == 0 else 100.0 * ((value - low.per_seed[seed]) / span)

    def normalized(self, score: Score) -> float:
        """``score``'s mean on the anchors' scale (:meth:`normalized_value`)."""
        return self.normalized_value(score.mean(self.ranking))

    def agent_groups(self) -> dict[str, list[Score]]:
        """Trained agents that differ only in their training seed (``rl:NAME__s<k>``), two runs or more each."""
        groups: dict[str, list[Score]] = {}
        for score in self.scores:
            if score.policy.startswith("rl:") and re.search(r"__s\d+$", score.policy):
                groups.setdefault(re.sub(r"__s\d+$", "", score.policy), []).append(score)
        return {name: runs for name, runs in groups.items() if len(runs) >= 2}

    def versus_best_heuristic(self, score: Score) -> Interval | None:
        """``score`` minus the best heuristic on the ranking metric, paired per seed (positive: higher)."""
        best = self.best_heuristic
        return None if best is None else paired_difference(score.per_seed, best.per_seed)

    def gain(self, score: Score, reference: Score) -> float:
        """Relative improvement of ``score`` over ``reference`` on the ranking metric (positive: better)."""
        value, base = score.mean(self.ranking), reference.mean(self.ranking)
        if math.isnan(value) or math.isnan(base):
            return math.nan
        change = (base - value) if self.lower_is_better else (value - base)
        if base == 0:
            return 0.0 if change == 0 else math.copysign(math.inf, change)
        return change / abs(base)

    @property
    def verdict(self) -> str:
        """``decision-sensitive``, ``flat``, or ``undetermined`` (random or FCFS, or every candidate, missing, or
        fewer than ``MIN_VERDICT_SEEDS`` episodes of one of them)."""
        random, fcfs = (self.score(label) for label in self.floors)
        best = self.best
        if random is None or fcfs is None or best is None:
            return "undetermined"
        if min(s.episodes for s in (random, fcfs, best)) < MIN_VERDICT_SEEDS:
            return "undetermined"
        sensitive = min(self.gain(best, random), self.gain(best, fcfs)) >= SENSITIVE
        return "decision-sensitive" if sensitive else "flat"


def boards(rows: Sequence[BenchRow], rankings: Mapping[str, str] | None = None) -> list[TaskBoard]:
    """Group ``rows`` by task (in order of appearance) and score each policy, best first by the task's ranking
    metric (``rankings`` overrides :attr:`Task.ranking` per task); NaN means sort last."""
    result = []
    for task in dict.fromkeys(row.task for row in rows):
        ranking = (rankings or {}).get(task) or get_task(task).ranking
        if ranking not in LOWER_IS_BETTER:
            raise ValueError(f"task {task!r} ranks by {ranking!r}; the leaderboard ranks by one of "
                             f"{sorted(LOWER_IS_BETTER)}")
        task_rows = [row for row in rows if row.task == task]
        scores: list[Score] = []
        for label in dict.fromkeys(row.policy for row in task_rows):
            runs = [row for row in task_rows if row.policy == label]
            metrics = {m: mean_ci(np.array([float(getattr(row, m)) for row in runs])) for m in METRICS}
            scores.append(Score(label, metrics, len(runs), sum(bool(row.truncated) for row in runs),
                                {row.seed: float(getattr(row, ranking)) for row in runs}))
        sign = 1.0 if LOWER_IS_BETTER[ranking] else -1.0
        scores.sort(key=lambda s: (math.isnan(s.mean(ranking)), sign * np.nan_to_num(s.mean(ranking))))
        apart = [s for s in scores if is_validation(s.policy)]
        scores = [s for s in scores if not is_validation(s.policy)]
        validation = tuple(Score(s.policy.removesuffix(VALIDATION_SUFFIX), s.metrics, s.episodes, s.truncated,
                                 s.per_seed) for s in apart)
        result.append(TaskBoard(task, ranking,
                                tuple(s for s in scores if not (is_engine_config(s.policy) or is_unranked(s.policy))),
                                tuple(s for s in scores if is_engine_config(s.policy)),
                                tuple(s for s in scores if is_unranked(s.policy) and not is_engine_config(s.policy)),
                                validation))
    return result
