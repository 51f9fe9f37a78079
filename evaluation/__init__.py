"""Policy comparisons: experiment files, a parallel grid runner, tidy results, tables and the papers' plots."""

from __future__ import annotations

from pathlib import Path

from servegym.evaluation.executor import PROCESSES, Executor, Interrupted, JobFailed, RunStore
from servegym.evaluation.grid import TaskResult, run_grid, run_task, tasks
from servegym.evaluation.report import markdown_summary, summarize_results, write_reports
from servegym.evaluation.spec import (
    Experiment,
    ExperimentError,
    PolicySpec,
    WorkloadSpec,
    build_workload,
    experiment_from_dict,
    load_experiment,
)
from servegym.evaluation.stats import mean_ci

DEFAULT_EXPERIMENT = {
    "name": "default",
    "description": (
        "The seed papers' policies and baselines on the four TWP scenarios (low, medium, high, burst) of the "
        "default profile (Llama-3-8B on an A100, from measured tables), with predicted output lengths (a seeded "
        "interval around the truth)."
    ),
    "regime": (
        "The default workload on the default calibrated profile: a quick comparison of the hand-coded policies, not a "
        "paper's setting."
    ),
    "seeds": 5,
    "engine": {"length_mode": "predicted"},
    "policies": ["twp", "flow-control", "fcfs", "round-robin", "priority", "dynamic-batch", "serverless-llm",
                 "alpha-protection", "mc", "mc-sf", "amin", "vllm", "sarathi", "clairvoyant-greedy"],
    "workloads": ["low", "medium", "high", "burst"],
}


def default_experiment() -> Experiment:
    return experiment_from_dict(DEFAULT_EXPERIMENT, "the built-in default experiment")


def compare(experiment: Experiment, out: Path, workers: int | None = None, progress: bool = True,
            plots: bool = True, resume: bool = True,
            executor: Executor = PROCESSES, timeline: bool = False) -> tuple[list[TaskResult], dict[str, Path]]:
    """Run ``experiment`` and write ``results.csv``, ``summary.md``, (``plots``) the PNG figures and
    (``timeline``) ``timeline.png``: every policy's episode of the first seed on the focus workload, side by side
    (those episodes are run again, in this process).

    Each finished run is kept in ``out/runs/`` as it finishes; with ``resume`` (the default) runs already there
    are not run again. Reports from an earlier call are removed first and written atomically at the end; when
    Ctrl-C or a failed run stops the grid, the reports cover the finished runs and say they are partial, and
    the exception (:class:`~servegym.evaluation.executor.Interrupted` or ``JobFailed``) propagates.
    ``executor`` says where the runs go: worker processes on this machine (the default) or Ray tasks
    (``Executor("ray", address)``), with the same results.
    """
    out.mkdir(parents=True, exist_ok=True)
    store = RunStore(out / "runs")
    if not resume:
        store.clear()
    for stale in ("results.csv", "summary.md"):
        (out / stale).unlink(missing_ok=True)
    try:
        results = run_grid(experiment, workers=workers, progress=progress, store=store, executor=executor)
    except (Interrupted, JobFailed) as stop:
        write_reports(experiment, [stop.results[i] for i in sorted(stop.results)], out,
                      partial=len(stop.results))
        raise
    paths = write_reports(experiment, results, out)
    if plots:
        from servegym.evaluation.plots import plot_all

        for path in plot_all(results, summarize_results(results), out):
            paths[path.stem] = path
    if timeline:
        from servegym.evaluation.timeline import plot_policies

        paths["timeline"] = plot_policies(experiment, out / "timeline.png")
    return results, paths


__all__ = [
    "DEFAULT_EXPERIMENT",
    "Executor",
    "Experiment",
    "ExperimentError",
    "PolicySpec",
    "TaskResult",
    "WorkloadSpec",
    "build_workload",
    "compare",
    "default_experiment",
    "experiment_from_dict",
    "load_experiment",
    "markdown_summary",
    "mean_ci",
    "run_grid",
    "run_task",
    "summarize_results",
    "tasks",
    "write_reports",
]
