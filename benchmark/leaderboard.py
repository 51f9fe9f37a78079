"""The leaderboard's Markdown: the across-task aggregates, then per task its seeds and anchors, the policies
best-first with their normalized scores and Holm-marked paired comparisons, and whether its decisions matter.

The scores themselves are :mod:`servegym.benchmark.board`; the statistics over the whole board (Holm's correction,
rliable's aggregates) :mod:`servegym.benchmark.aggregate`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from servegym import ENV_ID
from servegym.benchmark.aggregate import ALPHA, PROFILE_TAUS, SCORE_CLIP, across_tasks, holm, paired_p_value
from servegym.benchmark.board import (
    COLUMN_METRICS,
    HEADERS,
    INTERRUPTED_MARK,
    LOWER_IS_BETTER,
    METRICS,
    ROUTING_BASE,
    ROUTING_COLUMNS,
    SENSITIVE,
    Score,
    TaskBoard,
    boards,
    is_interrupted,
)
from servegym.benchmark.oracle import BOARD_VERSION, FROZEN_BASES, ORACLE, Budget
from servegym.envs.tasks import VALIDATION_SEEDS, get_task
from servegym.evaluation.stats import MIN_VERDICT_SEEDS, bootstrap_interval, iqm, mean_ci, paired_difference
from servegym.evaluation.stats import probability_of_improvement as p_improve
from servegym.metrics import metric

if TYPE_CHECKING:
    from servegym.benchmark.bench import BenchRow


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


def _seeds(seeds: Sequence[int]) -> str:
    """``900000-900029 (30)``, or the list where the seeds are not consecutive."""
    seeds = sorted(seeds)
    if not seeds:
        return "none"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]} ({len(seeds)})" if len(seeds) > 1 else f"{seeds[0]} (1)"
    return f"{', '.join(map(str, seeds))} ({len(seeds)})"


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
    """Whether the oracle is at or above every test-track policy on every seed they share (empty without one): it
    is a bound of this board only when it is."""
    oracle = board.score(ORACLE)
    if oracle is None:
        return ""
    sign = -1.0 if board.lower_is_better else 1.0
    broken = []
    for s in board.scores:
        seeds = [k for k, v in s.per_seed.items() if k in oracle.per_seed and sign * (v - oracle.per_seed[k]) > 0]
        if s is not oracle and seeds:
            broken.append(f"`{s.policy}` on {len(seeds)} seed{'s' * (len(seeds) > 1)} ({', '.join(map(str, seeds))})")
    if broken:
        return ("**Oracle beaten:** planned over its frozen bases only, the oracle is not a bound of this board: "
                + "; ".join(broken) + ".")
    others = sum(1 for s in board.scores if s is not oracle)
    return (f"**Bound:** the oracle is at or above all {others} other test-track policies on every one of their "
            "seeds (the best found, not the optimum).")


def comparisons(task_boards: Sequence[TaskBoard], rows: Sequence[BenchRow]) -> dict[Hashable, float]:
    """Every paired comparison the board marks, as a two-sided p-value: each ranked row against its task's best
    heuristic (key ``("best", task, label)``) and, on a routing task, each router against round-robin on each
    routing column (``("route", task, label, column)``)."""
    tests: dict[Hashable, float] = {}
    for board in task_boards:
        best = board.best_heuristic
        for score in board.scores:
            if best is not None and score is not best and score.per_seed.keys() == best.per_seed.keys():
                seeds = sorted(score.per_seed)
                tests[("best", board.task, score.policy)] = paired_p_value(
                    [score.per_seed[s] - best.per_seed[s] for s in seeds])
        for label, column, diffs in _routing_differences(board, rows):
            tests[("route", board.task, label, column)] = paired_p_value(diffs)
    return tests


def _mark(diff_mean: float, lower_is_better: bool, p_holm: float | None) -> str:
    """`` (better)``/`` (worse)`` when the Holm-adjusted p-value is below :data:`ALPHA`, else nothing."""
    if p_holm is None or math.isnan(p_holm) or p_holm >= ALPHA or diff_mean == 0:
        return ""
    return " (better)" if (diff_mean > 0) != lower_is_better else " (worse)"


def _versus(board: TaskBoard, score: Score, adjusted: Mapping[Hashable, float]) -> str:
    if score is board.best_heuristic:
        return "best heuristic"
    diff = board.versus_best_heuristic(score)
    if diff is None:
        return "n/a"
    digits = _decimals(diff.mean)
    p = adjusted.get(("best", board.task, score.policy))
    shown = "" if p is None or math.isnan(p) else f", p_Holm {_p(p)}"
    return (f"{diff.mean:+.{digits}f}, CI [{diff.low:.{digits}f}, {diff.high:.{digits}f}]{shown}"
            f"{_mark(diff.mean, board.lower_is_better, p)}")


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def shown_columns(task: str) -> tuple[str, ...]:
    """The score columns of ``task``'s tables: the prefix hit ratio only where the task caches prefixes."""
    cached = bool(get_task(task).engine.get("prefix_caching"))
    return tuple(m for m in METRICS if cached or m != "prefix_hit_ratio")


def _headers(task: str) -> list[str]:
    return [HEADERS[METRICS.index(m)] for m in shown_columns(task)]


def _rows(board: TaskBoard, scores: Sequence[Score], adjusted: Mapping[Hashable, float] | None) -> list[str]:
    """Table rows; with ``adjusted`` (the ranked table) the normalized score and the comparison too."""
    lines = []
    for rank, score in enumerate(scores, 1):
        cells = [_cell(*score.metrics[m]) for m in shown_columns(board.task)]
        extra = ("" if adjusted is None else
                 f"{_score_cell(board.normalized(score))} | {_versus(board, score, adjusted)} | ")
        lines.append(f"| {rank} | {score.policy} | {extra}" + " | ".join(cells)
                     + f" | {score.truncated}/{score.episodes} |")
    return lines


def _score_cell(value: float) -> str:
    low, high = SCORE_CLIP
    if math.isnan(value):
        return "n/a"
    return f"<{low:.0f}" if value < low else f">{high:.0f}" if value > high else f"{value:.0f}"


def agent_table(board: TaskBoard) -> list[str]:
    """Agents over their training seeds, as rliable aggregates: the interquartile mean of the ranking metric over
    every (run, test seed) episode, and the probability that an episode beats the best heuristic on its seed,
    each with a 95% bootstrap interval over runs and seeds."""
    best = board.best_heuristic
    groups = board.agent_groups()
    if not groups or best is None:
        return []
    higher = not board.lower_is_better
    lines = ["Agents over training seeds (interquartile mean of the ranking metric, and as a normalized score, "
             f"and probability of improvement over the best heuristic `{best.policy}`, 95% bootstrap intervals over "
             "runs and seeds):", "",
             "| agent | runs | IQM | IQM (score) | P(episode beats the best heuristic) |", "|---|---:|---:|---:|---:|"]
    for name, runs in groups.items():
        seeds = sorted(set.intersection(*(set(r.per_seed) for r in runs)) & set(best.per_seed))
        matrix = np.array([[r.per_seed[s] for s in seeds] for r in runs])
        base = np.array([best.per_seed[s] for s in seeds])
        value, (low, high) = iqm(matrix), bootstrap_interval(iqm, matrix)
        chance = p_improve(matrix, base, higher)
        plow, phigh = bootstrap_interval(lambda m, b: p_improve(m, b, higher), matrix, base)
        digits = _decimals(value)
        ends = sorted(board.normalized_value(v) for v in (low, high))  # a lower-is-better metric reverses them
        middle = board.normalized_value(value)
        score = "n/a" if math.isnan(middle) else \
            f"{_score_cell(middle)} [{_score_cell(ends[0])}, {_score_cell(ends[1])}]"
        lines.append(f"| {name}__s* | {len(runs)} | {value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}] | "
                     f"{score} | {chance:.2f} [{plow:.2f}, {phigh:.2f}] |")
    return [*lines, ""]


def _interrupted_note(board: TaskBoard) -> list[str]:
    """A line under the table when an agent on it is marked interrupted."""
    marked = [s.policy for s in (*board.scores, *board.engine_config) if is_interrupted(s.policy)]
    if not marked:
        return []
    return [f"`{INTERRUPTED_MARK.strip()}`: an agent whose training stopped before its timesteps ({len(marked)} on "
            "this board); its `config.json` says how far it got, and `servegym train --resume RUN` finishes it. It is "
            "not a finished result and cannot be submitted.", ""]


def _routing_differences(board: TaskBoard, rows: Sequence[BenchRow]) -> list[tuple[str, str, list[float]]]:
    """On a routing task: (label, column, per-seed differences to round-robin) for each router and agent."""
    if get_task(board.task).decision != "route" or board.score(ROUTING_BASE) is None:
        return []

    def per_seed(label: str, column: str) -> dict[int, float]:
        return {r.seed: float(getattr(r, column)) for r in rows if r.task == board.task and r.policy == label}

    out = []
    for score in board.scores:
        if score.policy in (ROUTING_BASE, ORACLE):
            continue
        for column in ROUTING_COLUMNS:
            mine, base = per_seed(score.policy, column), per_seed(ROUTING_BASE, column)
            if mine.keys() == base.keys():
                out.append((score.policy, column, [mine[s] - base[s] for s in sorted(mine)]))
    return out


def routing_table(board: TaskBoard, rows: Sequence[BenchRow], adjusted: Mapping[Hashable, float] | None = None
                  ) -> list[str]:
    """On a routing task: each router and agent minus :data:`ROUTING_BASE` on the prefix hit ratio, the mean
    end-to-end latency and the return, paired over the seeds, with 95% CIs and marks Holm-adjusted over
    ``adjusted`` (default: this task's comparisons alone)."""
    adjusted = adjusted if adjusted is not None else holm(comparisons([board], rows))
    found = _routing_differences(board, rows)
    if not found:
        return []
    names = [metric(COLUMN_METRICS[c]).header for c in ROUTING_COLUMNS]
    lines = [f"Versus `{ROUTING_BASE}`, paired per seed (mean difference, 95% CI; *better*/*worse* when the "
             "Holm-adjusted p-value is below 0.05):", "", "| policy | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    cells: dict[str, list[str]] = {}
    for label, column, diffs in found:
        mean, half = mean_ci(np.array(diffs))
        digits = 3 if column == "prefix_hit_ratio" else _decimals(mean)
        mark = _mark(mean, LOWER_IS_BETTER[column], adjusted.get(("route", board.task, label, column)))
        cells.setdefault(label, []).append(f"{mean:+.{digits}f} [{mean - half:.{digits}f}, "
                                           f"{mean + half:.{digits}f}]{mark}")
    lines += [f"| {label} | " + " | ".join(row) + " |" for label, row in cells.items()]
    return [*lines, ""]


def anchor_line(board: TaskBoard) -> str:
    """The normalized score's fixed anchors on this task, and how far apart they lie."""
    low, high = board.anchors
    if low is None or high is None:
        return (f"**Anchors:** 0 = `{board.floors[0]}`, 100 = `{ORACLE}`; "
                f"{'neither' if low is None and high is None else 'one'} ran here, so no normalized score.")
    a, b = low.mean(board.ranking), high.mean(board.ranking)
    apart = abs(b - a) / abs(a) if a else math.inf
    note = (f" The anchors lie {apart:.1%} apart: one point of score is {apart / 100:.3%} of `{board.ranking}`, "
            f"so scores magnify small differences here (shown clipped to {SCORE_CLIP[0]:.0f}..{SCORE_CLIP[1]:.0f})."
            if apart < SENSITIVE else "")
    return (f"**Anchors:** 0 = `{board.floors[0]}` ({a:.{_decimals(a)}f}), 100 = `{ORACLE}` ({b:.{_decimals(b)}f}),"
            f" fixed per board version.{note}")


def task_table(board: TaskBoard, rows: Sequence[BenchRow] = (), adjusted: Mapping[Hashable, float] | None = None
               ) -> list[str]:
    adjusted = adjusted if adjusted is not None else holm(comparisons([board], rows))
    direction = "lower is better" if board.lower_is_better else "higher is better"
    seeds = sorted(set().union(*(s.per_seed for s in board.scores))) if board.scores else []
    task = get_task(board.task)
    best = board.best_heuristic
    where = (f"chosen on the validation seeds {_seeds(sorted(board.validation[0].per_seed))}, training data"
             if board.chosen_on_validation else "chosen on the test seeds (no validation episodes on this board)")
    headers = _headers(board.task)
    lines = [f"## {board.task}", "", f"{task.summary}.", "",
             f"Reward `{task.reward}`; ranked by `{board.ranking}` ({direction}); test seeds {_seeds(seeds)}; best "
             f"heuristic: `{best.policy if best else 'none'}` ({where}).", "", anchor_line(board), "",
             "| # | policy | score | vs best heuristic (paired, 95% CI, Holm) | " + " | ".join(headers)
             + " | truncated |", "|---:|---|---:|---|" + "---:|" * (len(headers) + 1),
             *_rows(board, board.scores, adjusted), "", *_interrupted_note(board), headroom_line(board), "",
             *([bound_line(board), ""] if board.score(ORACLE) else []), *agent_table(board),
             *routing_table(board, rows, adjusted)]
    for title, scores in (("Engine-config track: each policy on its own engine settings, not the task's (not ranked "
                           "against the table above).", board.engine_config),
                          ("Unranked: tuned parameters and agents whose record shows test data, another env version "
                           "or no record (the reason is in the label); shown, never ranked, never in the headroom.",
                           board.unranked)):
        if scores:
            lines += [title, "", "| # | policy | " + " | ".join(headers) + " | truncated |",
                      "|---:|---|" + "---:|" * (len(headers) + 1), *_rows(board, scores, None), ""]
    return lines


def aggregate_table(task_boards: Sequence[TaskBoard]) -> list[str]:
    """Per decision (admission, routing), the policies that ran on every task of it with both anchors, aggregated
    across those tasks with rliable."""
    lines: list[str] = []
    for decision in ("admission", "route"):
        anchored = [b for b in task_boards
                    if get_task(b.task).decision == decision and all(a is not None for a in b.anchors)]
        if anchored:
            lines += _aggregate(anchored)
    return lines


def _aggregate(anchored: Sequence[TaskBoard]) -> list[str]:
    common = set.intersection(*({s.policy for s in b.scores} for b in anchored))
    n = min(min(len(b.score(p).per_seed) for b in anchored) for p in common) if common else 0
    if not common or n < MIN_VERDICT_SEEDS:
        return []
    matrices = {}
    for policy in sorted(common):
        columns = []
        for b in anchored:
            per_seed = b.score(policy).per_seed
            columns.append([b.normalized_on_seed(b.score(policy), s) for s in sorted(per_seed)[:n]])
        matrices[policy] = np.array(columns).T
    stats = across_tasks(matrices)
    taus = " | ".join(f"P(score > {tau:g})" for tau in PROFILE_TAUS)
    lines = [f"## Across tasks ({', '.join(b.task for b in anchored)})", "",
             "Normalized scores, each episode against the anchors' episodes on the same seed (0 = random floor, 100 "
             f"= oracle, clipped to {SCORE_CLIP[0]:.0f}..{SCORE_CLIP[1]:.0f}) of the policies that ran on every one "
             f"of these tasks, over the first {n} test seeds of each (the "
             "fewest any task has, so every task weighs the same): rliable's interquartile mean, optimality gap "
             "(mean shortfall below 100) and performance profile (the fraction of (seed, task) episodes above a "
             "score), each with a 95% stratified-bootstrap interval (seeds resampled within each task). Best IQM "
             "first.", "", f"| policy | IQM | optimality gap | {taus} |",
             "|---|---:|---:|" + "---:|" * len(PROFILE_TAUS)]
    for policy in sorted(stats, key=lambda p: -stats[p]["iqm"][0]):
        row = stats[policy]
        profile = " | ".join("{:.2f} [{:.2f}, {:.2f}]".format(*row[f"above_{tau:g}"]) for tau in PROFILE_TAUS)
        lines.append(f"| {policy} | " + " | ".join("{:.1f} [{:.1f}, {:.1f}]".format(*row[k])
                                                    for k in ("iqm", "optimality_gap")) + f" | {profile} |")
    return [*lines, ""]


def markdown(rows: Sequence[BenchRow], command: str = "servegym bench",
             rankings: Mapping[str, str] | None = None, built_by: str = "") -> str:
    """The whole ``leaderboard.md``: the verdicts, the across-task aggregates, then one table per task
    (``rankings`` as in :func:`~servegym.benchmark.board.boards`)."""
    task_boards = boards(rows, rankings)
    adjusted = holm(comparisons(task_boards, rows))
    groups = {v: [b.task for b in task_boards if b.verdict == v] for v in ("decision-sensitive", "flat",
                                                                           "undetermined")}
    budget = Budget()
    lines = [
        "# servegym leaderboard",
        "",
        f"Generated by `servegym bench` (do not edit by hand): `{command}`"
        + (f"; built by {built_by}." if built_by else "."),
        "",
        f"Every task runs exactly its own settings (`gym.make(\"{ENV_ID}\", task=NAME, split=\"test\")`: workload "
        "and its held-out test data, profile, engine, pool, reward, length mode) on its test seeds, whatever a "
        "policy or an agent would set for itself; a policy that changes those settings also runs in its task's "
        "*engine-config* track, shown apart, and a tuned file or agent that saw test data, another env version or "
        "has no record is shown *unranked*. Cells are mean ± 95% CI half-width over seeds. *Score* is normalized "
        "to fixed anchors on the ranking metric: 0 = the task's random floor, 100 = its oracle (clipped to "
        f"{SCORE_CLIP[0]:.0f}..{SCORE_CLIP[1]:.0f}). *Vs best heuristic* is the per-seed paired difference to the "
        "hand-coded policy best on the validation seeds (training data, "
        f"{_seeds(VALIDATION_SEEDS)}), so the test seeds never choose it; *better*/*worse* mark a difference "
        f"whose p-value (paired t-test) stays below {ALPHA} after Holm's correction over all "
        f"{len(adjusted)} comparisons of this board. The *oracle* (board version {BOARD_VERSION}) is a "
        "clairvoyant rollout planner on copies of the task's env over a frozen base set (admission: "
        f"{', '.join(FROZEN_BASES['admission'])} at default parameters, and the task's tuned parameter sets as they "
        "were when the version was made; routing: every router and the tuned kv-aware router), never the board's "
        "other contestants: "
        f"each base plays the whole episode, then at {budget.replans} decision points the best {budget.width} "
        "finish it from the state reached and the plan switches when one finishes higher. Its return is at least "
        "each base's on every seed; it is the best the search found, not the optimum, and each task's bound line "
        "says whether any contestant beats it. *Return* is the episode's undiscounted reward sum in the task's "
        "reward units (`latency`: minus request-seconds in the system; `slo_goodput`: requests within both SLOs). "
        "*E2E mean, all* counts every arrived, unrejected request, the unfinished up to the episode's end. "
        "Policies are sorted best-first by the task's ranking metric. A task is "
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
    lines += ["", *aggregate_table(task_boards)]
    for board in task_boards:
        lines += task_table(board, rows, adjusted)
    return "\n".join(lines)
