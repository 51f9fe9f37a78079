"""The leaderboard's Markdown: per task, the policies best-first, and whether the task's decisions matter.

A task is *decision-sensitive* when the best non-reference policy or the clairvoyant greedy packer is at least 15%
better than both random admission and FCFS on the task's ranking metric; otherwise it is *flat* (any sensible
policy scores about the same there). Gains are relative to the reference's magnitude and positive when better:
``(value - reference) / |reference|`` where higher is better (the episode return, goodput), the negative of that
where lower is better (latency). For a negative return (minus request-seconds) that is the latency reduction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from servegym.envs.tasks import get_task
from servegym.evaluation.stats import MIN_VERDICT_SEEDS, mean_ci

if TYPE_CHECKING:
    from servegym.evaluation.bench import BenchRow

REFERENCES = ("random", "fcfs", "clairvoyant-greedy")
"""Labels of the reference policies: the floors to beat (random, FCFS) and the clairvoyant greedy packer (true
lengths; a comparison point, not a ceiling: tuned policies beat it)."""
SENSITIVE = 0.15
"""Relative gain over both random and FCFS that makes a task decision-sensitive."""
LOWER_IS_BETTER = {"episode_return": False, "goodput_rps": False, "e2e_mean_all_s": True, "ttft_p99_s": True,
                   "unfinished": True}
"""The metrics a task may rank by (``Task.ranking``), and their direction."""
METRICS = ("episode_return", "goodput_rps", "e2e_mean_all_s", "ttft_p99_s", "unfinished")
HEADERS = ("return", "goodput (req/s)", "E2E mean, all (s)", "TTFT P99 (s)", "unfinished")


@dataclass(frozen=True)
class Score:
    """One policy on one task: metric -> (mean, 95% CI half-width) over seeds."""

    policy: str
    metrics: dict[str, tuple[float, float]]
    episodes: int
    truncated: int

    def mean(self, metric: str) -> float:
        return self.metrics[metric][0]


@dataclass(frozen=True)
class TaskBoard:
    """One task's scores, best first by its ranking metric."""

    task: str
    ranking: str
    scores: tuple[Score, ...]

    @property
    def lower_is_better(self) -> bool:
        return LOWER_IS_BETTER[self.ranking]

    def score(self, label: str) -> Score | None:
        return next((s for s in self.scores if s.policy == label), None)

    @property
    def best(self) -> Score | None:
        """The best policy that is not a reference."""
        return next((s for s in self.scores if s.policy not in REFERENCES), None)

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
        random, fcfs = self.score("random"), self.score("fcfs")
        candidates = [s for s in (self.best, self.score("clairvoyant-greedy")) if s is not None]
        if random is None or fcfs is None or not candidates:
            return "undetermined"
        if min(s.episodes for s in (random, fcfs, *candidates)) < MIN_VERDICT_SEEDS:
            return "undetermined"
        sensitive = any(min(self.gain(s, random), self.gain(s, fcfs)) >= SENSITIVE for s in candidates)
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
            scores.append(Score(label, metrics, len(runs), sum(bool(row.truncated) for row in runs)))
        sign = 1.0 if LOWER_IS_BETTER[ranking] else -1.0
        scores.sort(key=lambda s: (math.isnan(s.mean(ranking)), sign * np.nan_to_num(s.mean(ranking))))
        result.append(TaskBoard(task, ranking, tuple(scores)))
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
    """The best policy's and the clairvoyant greedy packer's gains over random and FCFS, and the verdict."""
    random, fcfs = board.score("random"), board.score("fcfs")
    parts = []
    for name, score in ((f"best policy `{board.best.policy}`" if board.best else "", board.best),
                        ("clairvoyant greedy", board.score("clairvoyant-greedy"))):
        if score is None:
            continue
        gains = ", ".join(f"{_percent(board.gain(score, ref))} vs {ref_name}"
                          for ref_name, ref in (("random", random), ("FCFS", fcfs)) if ref is not None)
        value = score.mean(board.ranking)
        parts.append(f"{name} ({value:.{_decimals(value)}f}" + (f"; {gains})" if gains else ")"))
    text = "; ".join(parts) or "no candidate policy"
    return f"**Headroom** on `{board.ranking}`: {text} → **{board.verdict}**."


def task_table(board: TaskBoard) -> list[str]:
    direction = "lower is better" if board.lower_is_better else "higher is better"
    episodes = max(s.episodes for s in board.scores)
    task = get_task(board.task)
    lines = [f"## {board.task}", "", f"{task.summary}.", "",
             f"Reward `{task.reward}`; ranked by `{board.ranking}` ({direction}); {episodes} seeds per policy.", "",
             "| # | policy | " + " | ".join(HEADERS) + " | truncated |",
             "|---:|---|" + "---:|" * (len(HEADERS) + 1)]
    for rank, score in enumerate(board.scores, 1):
        cells = [_cell(*score.metrics[m]) for m in METRICS]
        lines.append(f"| {rank} | {score.policy} | " + " | ".join(cells) + f" | {score.truncated}/{score.episodes} |")
    return [*lines, "", headroom_line(board), ""]


def markdown(rows: Sequence[BenchRow], command: str = "servegym bench",
             rankings: Mapping[str, str] | None = None) -> str:
    """The whole ``leaderboard.md``: the verdicts, then one table per task (``rankings`` as in :func:`boards`)."""
    task_boards = boards(rows, rankings)
    groups = {v: [b.task for b in task_boards if b.verdict == v] for v in ("decision-sensitive", "flat",
                                                                           "undetermined")}
    lines = [
        "# servegym leaderboard",
        "",
        f"Generated by `servegym bench` (do not edit by hand): `{command}`.",
        "",
        "Every task runs its own settings (`gym.make(\"servegym/Serving-v0\", task=NAME)`) on the frozen test "
        "seeds; cells are mean ± 95% CI half-width over seeds. *Return* is the episode's undiscounted reward sum "
        "in the task's reward units (`latency`: minus request-seconds in the system; `slo_goodput`: requests "
        "within both SLOs). *E2E mean, all* counts every arrived, unrejected request, the unfinished up to the "
        "episode's end. Policies are sorted best-first by the task's ranking metric. A task is "
        f"**decision-sensitive** when the best non-reference policy or the clairvoyant greedy packer is at least "
        f"{SENSITIVE:.0%} "
        "better than both random and FCFS on that metric (gains are relative to the reference's magnitude, "
        "positive when better); "
        "otherwise it is **flat**.",
        "",
        f"- **Decision-sensitive:** {', '.join(groups['decision-sensitive']) or 'none'}",
        f"- **Flat:** {', '.join(groups['flat']) or 'none'}",
    ]
    if groups["undetermined"]:
        lines.append(f"- **Undetermined** (random or FCFS not run, or fewer than {MIN_VERDICT_SEEDS} seeds): "
                     f"{', '.join(groups['undetermined'])}")
    lines.append("")
    for board in task_boards:
        lines += task_table(board)
    return "\n".join(lines)
