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

from servegym.benchmark.oracle import ORACLE, Budget
from servegym.envs.tasks import get_task
from servegym.evaluation.stats import (
    MIN_VERDICT_SEEDS,
    Interval,
    bootstrap_interval,
    iqm,
    mean_ci,
    paired_difference,
    probability_of_improvement,
)
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
UNRANKED_MARK = " [unranked: "
"""Label mark of a tuned parameter set or a trained agent whose data record shows test data, another env version or
no record (:func:`~servegym.benchmark.provenance.unranked_reasons`): shown in its own table, with why, never ranked,
never in the headroom, never a base of the oracle, never the best heuristic."""
FLOORS = {"admission": ("random", "fcfs"), "route": ("router-round-robin", "router-round-robin")}
"""Per task decision (``Task.decision``): the random floor and the score's 0 (FCFS admits in arrival order; a routing
task's arrival-order rule is round-robin, which is also its decision-blind floor)."""
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
    def best_heuristic(self) -> Score | None:
        """The best hand-coded policy of the test track (FCFS and tuned variants included)."""
        return next((s for s in self.scores if is_heuristic(s.policy)), None)

    @property
    def floors(self) -> tuple[str, str]:
        """The labels of the random floor and of the score's 0 (:data:`FLOORS`)."""
        return FLOORS[get_task(self.task).decision]

    @property
    def anchor(self) -> Score | None:
        """The score's 100: the oracle, or the best heuristic on a board without one."""
        return self.score(ORACLE) or self.best_heuristic

    def normalized(self, score: Score) -> float:
        """0 = FCFS (round-robin on a routing task), 100 = :attr:`anchor`, on the ranking metric; NaN when they tie
        or one is missing."""
        fcfs, best = self.score(self.floors[1]), self.anchor
        if fcfs is None or best is None:
            return math.nan
        span = best.mean(self.ranking) - fcfs.mean(self.ranking)
        return math.nan if span == 0 else 100.0 * (score.mean(self.ranking) - fcfs.mean(self.ranking)) / span

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
        scores = []
        for label in dict.fromkeys(row.policy for row in task_rows):
            runs = [row for row in task_rows if row.policy == label]
            metrics = {m: mean_ci(np.array([float(getattr(row, m)) for row in runs])) for m in METRICS}
            scores.append(Score(label, metrics, len(runs), sum(bool(row.truncated) for row in runs),
                                {row.seed: float(getattr(row, ranking)) for row in runs}))
        sign = 1.0 if LOWER_IS_BETTER[ranking] else -1.0
        scores.sort(key=lambda s: (math.isnan(s.mean(ranking)), sign * np.nan_to_num(s.mean(ranking))))
        result.append(TaskBoard(task, ranking,
                                tuple(s for s in scores if not (is_engine_config(s.policy) or is_unranked(s.policy))),
                                tuple(s for s in scores if is_engine_config(s.policy)),
                                tuple(s for s in scores if is_unranked(s.policy) and not is_engine_config(s.policy))))
    return result


def _decimals(value: float) -> int:
    """About three significant digits, between 0 and 3 decimals."""
    if value == 0:
        return 0
    if not math.isfinite(value):
        return 2
    return max(0, min(3, 2 - math.floor(math.log10(abs(value)))))


def _cell(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "n/a"
    digits = _decimals(mean)
    return f"{mean:.{digits}f}" + ("" if math.isnan(half) else f" ± {half:.{digits}f}")


def _percent(gain: float) -> str:
    return "n/a" if math.isnan(gain) else ("+inf" if gain == math.inf else "-inf" if gain == -math.inf
                                           else f"{gain:+.1%}")


def headroom_line(board: TaskBoard) -> str:
    """The best test-track policy's gains over random and FCFS, and the verdict."""
    best = board.best
    if best is None:
        return f"**Headroom** on `{board.ranking}`: no candidate policy → **{board.verdict}**."
    gains = ", ".join(f"{_percent(board.gain(best, board.score(label)))} vs {_floor_name(label)}"
                      for label in dict.fromkeys(board.floors) if board.score(label) is not None)
    value = best.mean(board.ranking)
    text = f"best policy `{best.policy}` ({value:.{_decimals(value)}f}" + (f"; {gains})" if gains else ")")
    return f"**Headroom** on `{board.ranking}`: {text} → **{board.verdict}**.{_left(board, best)}"


def _floor_name(label: str) -> str:
    return "FCFS" if label == "fcfs" else label


def _left(board: TaskBoard, best: Score) -> str:
    """What the oracle leaves to gain over ``best`` (empty without an oracle)."""
    oracle, fcfs = board.score(ORACLE), board.score(board.floors[1])
    if oracle is None:
        return ""
    value = oracle.mean(board.ranking)
    text = f" The oracle reaches {value:.{_decimals(value)}f}"
    if fcfs is not None:
        text += f" ({_percent(board.gain(oracle, fcfs))} vs {_floor_name(board.floors[1])})"
    gap = paired_difference(oracle.per_seed, best.per_seed)
    digits = _decimals(gap.mean)
    return (text + f"; oracle minus `{best.policy}`, paired: {gap.mean:+.{digits}f}, CI [{gap.low:.{digits}f}, "
            f"{gap.high:.{digits}f}].")


def bound_line(board: TaskBoard) -> str:
    """Whether the oracle is at or above every test-track policy on every seed they share (empty without one)."""
    oracle = board.score(ORACLE)
    if oracle is None:
        return ""
    sign = -1.0 if board.lower_is_better else 1.0
    broken = []
    for s in board.scores:
        seeds = [k for k, v in s.per_seed.items() if k in oracle.per_seed and sign * (v - oracle.per_seed[k]) > 0]
        if s is not oracle and seeds:
            broken.append(f"`{s.policy}` on seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}")
    if broken:
        return "**Bound broken:** the oracle is beaten by " + "; ".join(broken) + "."
    others = sum(1 for s in board.scores if s is not oracle)
    return (f"**Bound:** the oracle is at or above all {others} other test-track policies on every one of their "
            "seeds.")


def _versus(board: TaskBoard, score: Score) -> str:
    if score is board.best_heuristic:
        return "best heuristic"
    diff = board.versus_best_heuristic(score)
    if diff is None:
        return "n/a"
    digits = _decimals(diff.mean)
    low, high = (-diff.high, -diff.low) if board.lower_is_better else (diff.low, diff.high)  # > 0: better
    verdict = " (better)" if low > 0 else " (worse)" if high < 0 else ""
    return f"{diff.mean:+.{digits}f}, CI [{diff.low:.{digits}f}, {diff.high:.{digits}f}]{verdict}"


def shown_columns(task: str) -> tuple[str, ...]:
    """The score columns of ``task``'s tables: the prefix hit ratio only where the task caches prefixes."""
    cached = bool(get_task(task).engine.get("prefix_caching"))
    return tuple(m for m in METRICS if cached or m != "prefix_hit_ratio")


def _headers(task: str) -> list[str]:
    return [HEADERS[METRICS.index(m)] for m in shown_columns(task)]


def _rows(board: TaskBoard, scores: Sequence[Score], paired: bool) -> list[str]:
    lines = []
    for rank, score in enumerate(scores, 1):
        cells = [_cell(*score.metrics[m]) for m in shown_columns(board.task)]
        extra = f"{_score_cell(board.normalized(score))} | {_versus(board, score)} | " if paired else ""
        lines.append(f"| {rank} | {score.policy} | {extra}" + " | ".join(cells)
                     + f" | {score.truncated}/{score.episodes} |")
    return lines


def _score_cell(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f}"


def agent_table(board: TaskBoard) -> list[str]:
    """Agents over their training seeds, as rliable aggregates: the interquartile mean of the ranking metric over
    every (run, test seed) episode, and the probability that an episode beats the best heuristic on its seed,
    each with a 95% bootstrap interval over runs and seeds."""
    best = board.best_heuristic
    groups = board.agent_groups()
    if not groups or best is None:
        return []
    higher = not board.lower_is_better
    lines = ["Agents over training seeds (interquartile mean and probability of improvement over the best "
             f"heuristic `{best.policy}`, 95% bootstrap intervals over runs and seeds):", "",
             "| agent | runs | IQM | P(episode beats the best heuristic) |", "|---|---:|---:|---:|"]
    for name, runs in groups.items():
        seeds = sorted(set.intersection(*(set(r.per_seed) for r in runs)) & set(best.per_seed))
        matrix = np.array([[r.per_seed[s] for s in seeds] for r in runs])
        base = np.array([best.per_seed[s] for s in seeds])
        value, (low, high) = iqm(matrix), bootstrap_interval(iqm, matrix)
        chance = probability_of_improvement(matrix, base, higher)
        plow, phigh = bootstrap_interval(lambda m, b: probability_of_improvement(m, b, higher), matrix, base)
        digits = _decimals(value)
        lines.append(f"| {name}__s* | {len(runs)} | {value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}] | "
                     f"{chance:.2f} [{plow:.2f}, {phigh:.2f}] |")
    return [*lines, ""]


def _interrupted_note(board: TaskBoard) -> list[str]:
    """A line under the table when an agent on it is marked interrupted."""
    marked = [s.policy for s in (*board.scores, *board.engine_config) if is_interrupted(s.policy)]
    if not marked:
        return []
    return [f"`{INTERRUPTED_MARK.strip()}`: an agent whose training stopped before its timesteps ({len(marked)} on "
            "this board); its `config.json` says how far it got, and `servegym train --resume RUN` finishes it. It is "
            "not a finished result and cannot be submitted.", ""]


def routing_table(board: TaskBoard, rows: Sequence[BenchRow]) -> list[str]:
    """On a routing task: each router and agent minus :data:`ROUTING_BASE` on the prefix hit ratio, the mean
    end-to-end latency and the return, paired over the seeds both ran, with 95% CIs."""
    if get_task(board.task).decision != "route" or board.score(ROUTING_BASE) is None:
        return []

    def per_seed(label: str, column: str) -> dict[int, float]:
        return {r.seed: float(getattr(r, column)) for r in rows if r.task == board.task and r.policy == label}

    names = [metric(COLUMN_METRICS[c]).header for c in ROUTING_COLUMNS]
    lines = [f"Versus `{ROUTING_BASE}`, paired per seed (mean difference, 95% CI; *better*/*worse* when the whole "
             "interval is):", "", "| policy | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for score in board.scores:
        if score.policy in (ROUTING_BASE, ORACLE):
            continue
        cells = []
        for column in ROUTING_COLUMNS:
            diff = paired_difference(per_seed(score.policy, column), per_seed(ROUTING_BASE, column))
            digits = 3 if column == "prefix_hit_ratio" else _decimals(diff.mean)
            mark = "" if diff.low <= 0 <= diff.high else \
                (" (better)" if (diff.low > 0) != LOWER_IS_BETTER[column] else " (worse)")
            cells.append(f"{diff.mean:+.{digits}f} [{diff.low:.{digits}f}, {diff.high:.{digits}f}]{mark}")
        lines.append(f"| {score.policy} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def task_table(board: TaskBoard, rows: Sequence[BenchRow] = ()) -> list[str]:
    direction = "lower is better" if board.lower_is_better else "higher is better"
    episodes = max(s.episodes for s in (*board.scores, *board.engine_config, *board.unranked))
    task = get_task(board.task)
    best = board.best_heuristic
    headers = _headers(board.task)
    lines = [f"## {board.task}", "", f"{task.summary}.", "",
             f"Reward `{task.reward}`; ranked by `{board.ranking}` ({direction}); {episodes} seeds per policy; "
             f"best heuristic: `{best.policy if best else 'none'}`.", "",
             "| # | policy | score | vs best heuristic (paired, 95% CI) | " + " | ".join(headers) + " | truncated |",
             "|---:|---|---:|---|" + "---:|" * (len(headers) + 1),
             *_rows(board, board.scores, paired=True), "", *_interrupted_note(board), headroom_line(board), "",
             *([bound_line(board), ""] if board.score(ORACLE) else []), *agent_table(board),
             *routing_table(board, rows)]
    if board.engine_config:
        lines += ["Engine-config track: each policy on its own engine settings, not the task's (not ranked against "
                  "the table above).", "", "| # | policy | " + " | ".join(headers) + " | truncated |",
                  "|---:|---|" + "---:|" * (len(headers) + 1), *_rows(board, board.engine_config, paired=False), ""]
    if board.unranked:
        lines += ["Unranked: tuned parameters and agents whose record shows test data, another env version or no "
                  "record (the reason is in the label); shown, never ranked, never in the headroom or the oracle.",
                  "", "| # | policy | " + " | ".join(headers) + " | truncated |",
                  "|---:|---|" + "---:|" * (len(headers) + 1), *_rows(board, board.unranked, paired=False), ""]
    return lines


def markdown(rows: Sequence[BenchRow], command: str = "servegym bench",
             rankings: Mapping[str, str] | None = None, built_by: str = "") -> str:
    """The whole ``leaderboard.md``: the verdicts, then one table per task (``rankings`` as in :func:`boards`)."""
    task_boards = boards(rows, rankings)
    groups = {v: [b.task for b in task_boards if b.verdict == v] for v in ("decision-sensitive", "flat",
                                                                           "undetermined")}
    lines = [
        "# servegym leaderboard",
        "",
        f"Generated by `servegym bench` (do not edit by hand): `{command}`"
        + (f"; built by {built_by}." if built_by else "."),
        "",
        "Every task runs exactly its own settings (`gym.make(\"servegym/Serving-v1\", task=NAME, split=\"test\")`: "
        "workload and its held-out test data, "
        "profile, engine, pool, reward, length mode) on the frozen test seeds, whatever a policy or an agent "
        "would set for itself; a policy that changes those settings also runs in its task's *engine-config* "
        "track, shown apart. Cells are mean ± 95% CI half-width over seeds. *Score* is 0 for FCFS (round-robin on a "
        "routing task, whose contestants route arrivals and admit by FCFS) and 100 for the "
        "task's oracle on the ranking metric (the best hand-coded heuristic where no oracle ran); *vs best "
        "heuristic* is the per-seed paired difference on that metric. The *oracle* is a clairvoyant rollout "
        f"planner on copies of the task's env: every other test-track policy plays the whole episode, then at "
        f"{Budget().replans} decision points the best {Budget().width} of them each finish it from the state "
        "reached, and the oracle switches when one finishes higher; its return is at least every contestant's on "
        "every seed (checked on each task's *bound* line), a ceiling for the board, not the optimum. "
        "*Return* is the episode's undiscounted reward sum "
        "in the task's reward units (`latency`: minus request-seconds in the system; `slo_goodput`: requests "
        "within both SLOs). *E2E mean, all* counts every arrived, unrejected request, the unfinished up to the "
        "episode's end. Policies are sorted best-first by the task's ranking metric. A task is "
        f"**decision-sensitive** when the best non-reference policy is at least {SENSITIVE:.0%} "
        "better than both random and FCFS on that metric (gains are relative to the reference's magnitude, "
        "positive when better); otherwise it is **flat**.",
        "",
        f"- **Decision-sensitive:** {', '.join(groups['decision-sensitive']) or 'none'}",
        f"- **Flat:** {', '.join(groups['flat']) or 'none'}",
    ]
    if groups["undetermined"]:
        lines.append(f"- **Undetermined** (random or FCFS not run, or fewer than {MIN_VERDICT_SEEDS} seeds): "
                     f"{', '.join(groups['undetermined'])}")
    lines.append("")
    for board in task_boards:
        lines += task_table(board, rows)
    return "\n".join(lines)
