"""After a study: best parameters, Optuna's plots, and default vs tuned on held-out seeds."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.evaluation.report import cell
from servegym.evaluation.stats import mean_ci
from servegym.metrics import metric as metric_of
from servegym.tuning.objectives import PARETO_METRICS, get_objective
from servegym.tuning.study import (
    NOT_COUNTED,
    TUNING_SEED_BASE,
    TuneConfig,
    best_params,
    evaluate,
    study_record,
    tuning_workload,
    write_params,
)

if TYPE_CHECKING:
    import optuna

REPORT_METRICS = ("goodput_rps", "throughput_rps", "ttft_p99", "itl_p99", "itl_cv", "e2e_mean")
"""The default-vs-tuned table's metrics (headers and formats from ``servegym.metrics.METRICS``)."""


def _plots(study, out: Path) -> list[Path]:
    import matplotlib
    import optuna

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    written = []
    multi = len(study.directions) > 1
    plots = [("pareto_front", vis.plot_pareto_front)] if multi else [
        ("optimization_history", vis.plot_optimization_history), ("param_importances", vis.plot_param_importances)]
    for name, plot in plots:
        try:
            with warnings.catch_warnings():  # Optuna marks its matplotlib plots experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                ax = plot(study)
        except (ValueError, RuntimeError, ZeroDivisionError):  # too few trials for importances, say
            continue
        fig = ax.figure if hasattr(ax, "figure") else ax[0].figure
        path = out / f"{name}.png"
        fig.set_size_inches(8, 5)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _not_counted(study: optuna.Study) -> str:
    """A note on the pruned trials that do not count towards ``--trials`` (cut short by a stop, or surplus)."""
    left_out = sum(NOT_COUNTED in t.user_attrs for t in study.get_trials(deepcopy=False))
    return f" (not counted: {left_out} pruned by a stop or as surplus)" if left_out else ""


def report(cfg: TuneConfig, study: optuna.Study, out: Path) -> dict[str, Any]:
    """Write ``best_params.json``, the plots and ``report.md``; return the summary numbers."""
    import optuna

    params = best_params(study)  # first: a study with no completed trial writes nothing
    out.mkdir(parents=True, exist_ok=True)
    objective = get_objective(cfg.objective)
    write_params(cfg.policy, params, out / "best_params.json",
                 note=f"study {cfg.name}: {cfg.objective} on {cfg.workload or cfg.env['task']}, tuning seeds from "
                      f"{TUNING_SEED_BASE}", record=study_record(cfg))
    plots = _plots(study, out)
    workload = tuning_workload(cfg)
    seeds = list(range(cfg.eval_seeds))
    default = evaluate(cfg.policy, {}, workload, seeds, cfg.max_steps, cfg.env)
    tuned = evaluate(cfg.policy, params, workload, seeds, cfg.max_steps, cfg.env)
    states = [t.state for t in study.trials]
    walls = [t.user_attrs["wall_s"] for t in study.trials if "wall_s" in t.user_attrs]
    counts = {s.name.lower(): states.count(s) for s in optuna.trial.TrialState if states.count(s)}
    target = f"task {cfg.env['task']}" if cfg.env.get("task") else cfg.workload
    lines = [
        f"# Tuning {cfg.policy} on {target}", "",
        f"Study `{cfg.name}` in `{cfg.storage_label()}`; objective **{cfg.objective}**: {objective.description}.",
        f"Trials: {counts}{_not_counted(study)}; wall time per completed trial: {np.mean(walls):.2f} s (mean over "
        f"{len(walls)})" if walls else f"Trials: {counts}{_not_counted(study)}.",
        f"Each trial averages {cfg.seeds} episodes on tuning seeds {TUNING_SEED_BASE}.."
        f"{TUNING_SEED_BASE + cfg.seeds - 1}; the comparison below uses held-out seeds 0..{cfg.eval_seeds - 1}, "
        "disjoint from them.", "",
        f"Best parameters: `{params}`", "",
    ]
    metrics = (*REPORT_METRICS, "episode_return") if cfg.objective == "return" else REPORT_METRICS
    lines += ["| | " + " | ".join(metric_of(m).header for m in metrics) + " |", "|---|" + "---|" * len(metrics)]
    summary = {"params": params, "default": {}, "tuned": {}}
    for label, runs in (("default", default), ("tuned", tuned)):
        cells = []
        for metric in metrics:
            mean, half = mean_ci(np.array([r[metric] for r in runs]))
            summary[label][metric] = mean
            cells.append(cell(mean, half, metric))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if objective.multi:
        front = [metric_of(m) for m in PARETO_METRICS]
        lines += ["", "Pareto front (tuning seeds):", "", "| trial | " + " | ".join(m.header for m in front)
                  + " | params |", "|---|" + "---|" * (len(front) + 1)]
        for t in sorted(study.best_trials, key=lambda t: -t.values[0]):
            values = " | ".join(m.format(v) for m, v in zip(front, t.values, strict=True))
            lines.append(f"| {t.number} | {values} | `{t.params}` |")
    lines += ["", *[f"![{p.stem}]({p.name})" for p in plots]]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    summary["wall_s_per_trial"] = float(np.mean(walls)) if walls else float("nan")
    return summary
