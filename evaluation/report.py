"""Results files: a tidy CSV (one row per policy x workload x seed x metric) and a Markdown summary."""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from servegym.evaluation.grid import TaskResult
from servegym.evaluation.spec import Experiment
from servegym.evaluation.stats import mean_ci
from servegym.metrics import metric as metric_of

TABLE_COLUMNS = ("throughput_rps", "e2e_p99", "ttft_p50", "ttft_p99", "itl_mean", "itl_p99", "itl_cv")
"""The summary table's metrics: the TWP paper's Table III shape (headers and formats from ``METRICS``)."""

Summary = dict[tuple[str, str, str], tuple[float, float, int]]
"""(workload, policy, metric) -> (mean, 95% CI half-width, runs)."""


TIDY_COLUMNS = ("policy", "workload", "seed", "metric", "value")
"""The columns of a ``results.csv``, one row per policy x workload x seed x metric."""


def write_tidy_csv(results: list[TaskResult], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TIDY_COLUMNS)
        for r in results:
            for metric, value in r.metrics.items():
                writer.writerow([r.policy, r.workload, r.seed, metric, repr(float(value))])


def read_tidy_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def results_from_tidy_csv(path: Path) -> list[TaskResult]:
    """The per-run metrics of a ``results.csv`` (no token-level samples), in the file's order; a file that is not
    one is a ``ValueError`` naming it and the first bad line."""
    runs: dict[tuple[str, str, int], dict[str, float]] = {}
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != TIDY_COLUMNS:
            raise ValueError(f"{path}: columns {reader.fieldnames} are not a results.csv's {list(TIDY_COLUMNS)}")
        for row in reader:
            try:
                key = (row["policy"], row["workload"], int(row["seed"]))
                runs.setdefault(key, {})[row["metric"]] = float(row["value"])
            except (TypeError, ValueError):
                raise ValueError(f"{path}, line {reader.line_num}: not a policy, workload, whole-number seed, "
                                 f"metric and number: {row}") from None
    empty = np.zeros(0)
    return [TaskResult(p, w, s, metrics, empty, empty) for (p, w, s), metrics in runs.items()]


def summarize_results(results: list[TaskResult]) -> Summary:
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in results:
        for metric, value in r.metrics.items():
            groups[(r.workload, r.policy, metric)].append(value)
    return {key: (*mean_ci(np.asarray(values)), len(values)) for key, values in groups.items()}


def ordered(results: list[TaskResult]) -> tuple[list[str], list[str]]:
    """Workloads and policies in first-seen order."""
    workloads = list(dict.fromkeys(r.workload for r in results))
    policies = list(dict.fromkeys(r.policy for r in results))
    return workloads, policies


def cell(mean: float, half: float, name: str) -> str:
    """A mean and its 95% CI half-width, in the metric's unit and format."""
    m = metric_of(name)
    return m.format(mean) if math.isnan(mean) or math.isnan(half) else f"{m.format(mean)} ± {m.format(half)}"


def markdown_summary(experiment: Experiment, results: list[TaskResult]) -> str:
    summary = summarize_results(results)
    workloads, policies = ordered(results)
    seeds = len(experiment.seeds)
    lines = [f"# {experiment.name}", ""]
    if experiment.description:
        lines += [experiment.description.strip(), ""]
    profile = f"`{experiment.profile}`" if experiment.profile else "each workload's own (`servegym workloads`)"
    if experiment.task is not None:
        profile = f"`{experiment.profile}`" if experiment.profile else "the task's"
        lines += [f"Every run plays task `{experiment.task}` ({experiment.split} data): its settings, with the "
                  "overrides below on top.", ""]
    lines += [f"Profile {profile}; {seeds} seed{'s' * (seeds != 1)} per cell; mean ± 95% confidence half-width "
              f"(Student t, n = {seeds}). Engine overrides: `{experiment.engine or {}}`; pool: "
              f"`{experiment.pool or {}}`.", ""]
    header = "| policy | " + " | ".join(metric_of(m).header for m in TABLE_COLUMNS) + " |"
    rule = "|---|" + "---|" * len(TABLE_COLUMNS)
    for workload in workloads:
        lines += [f"## {workload}", "", header, rule]
        for policy in policies:
            if (workload, policy, TABLE_COLUMNS[0]) not in summary:  # a stopped grid did not reach it
                continue
            cells = [cell(*summary[(workload, policy, m)][:2], m) for m in TABLE_COLUMNS]
            truncated = summary.get((workload, policy, "truncated"), (0.0,))[0]
            mark = " (truncated)" if truncated and truncated > 0 else ""
            lines.append(f"| {policy}{mark} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_reports(experiment: Experiment, results: list[TaskResult], out: Path,
                  partial: int | None = None) -> dict[str, Path]:
    """Write ``results.csv`` and ``summary.md`` atomically; ``partial`` (finished runs of a stopped grid) marks
    the summary as covering only those runs."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.csv", "summary": out / "summary.md"}
    tmp = out / "results.csv.tmp"
    write_tidy_csv(results, tmp)
    os.replace(tmp, paths["results"])
    text = markdown_summary(experiment, results) if results else f"# {experiment.name}\n\nNo run finished."
    if partial is not None:
        total = len(experiment.policies) * len(experiment.workloads) * len(experiment.seeds)
        text = (f"> **PARTIAL RESULTS**: the grid was stopped after {partial} of {total} runs; re-run the same "
                "command to finish it (finished runs are kept in `runs/`).\n\n" + text)
    tmp = out / "summary.md.tmp"
    tmp.write_text(text + "\n")
    os.replace(tmp, paths["summary"])
    return paths
