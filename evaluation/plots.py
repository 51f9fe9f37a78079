"""The papers' figures as PNG files (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegym.evaluation.grid import TaskResult
from servegym.evaluation.report import Summary, ordered
from servegym.metrics import metric as metric_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def focus_workload(workloads: list[str]) -> str:
    """The workload the single-workload figures show: a burst scenario when there is one."""
    return next((w for w in workloads if "burst" in w), workloads[0])


def _grouped_bars(ax: Any, summary: Summary, workloads: list[str], policies: list[str], metric: str,
                  scale: float = 1.0, ylabel: str = "") -> None:
    width = 0.8 / len(policies)
    x = np.arange(len(workloads))
    for i, policy in enumerate(policies):
        means = np.array([summary[(w, policy, metric)][0] for w in workloads]) * scale
        halves = np.nan_to_num(np.array([summary[(w, policy, metric)][1] for w in workloads]) * scale)
        ax.bar(x + (i - (len(policies) - 1) / 2) * width, means, width, yerr=halves, label=policy, capsize=2)
    ax.set_xticks(x, workloads, rotation=15)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


@dataclass(frozen=True)
class Grid:
    """What every figure reads: the runs, their summary, and the workload and seed the single-run figures show."""

    results: list[TaskResult]
    summary: Summary
    workloads: list[str]
    policies: list[str]
    focus: str
    first_seed: int

    @property
    def wide(self) -> float:
        return max(8.0, min(16.0, 0.25 * len(self.policies) * len(self.workloads) + 3))

    def focus_runs(self) -> list[TaskResult]:
        return [r for r in self.results if r.workload == self.focus and r.seed == self.first_seed]


def ttft_per_request(plt: Any, g: Grid) -> Figure:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in g.focus_runs():
        ax.plot(np.arange(r.ttft_by_request.size), r.ttft_by_request, lw=1, label=r.policy)
    ax.set(xlabel="request index", ylabel="TTFT (s)", title=f"TTFT per request ({g.focus}, seed {g.first_seed})")
    ax.legend(fontsize=7, ncol=2)
    return fig


def ttft_percentiles(plt: Any, g: Grid) -> Figure:
    fig, axes = plt.subplots(1, len(g.workloads), figsize=(max(6, 4 * len(g.workloads)), 4), squeeze=False)
    for ax, w in zip(axes[0], g.workloads, strict=True):
        x = np.arange(len(g.policies))
        for j, p in enumerate(("ttft_p50", "ttft_p95", "ttft_p99")):
            ax.bar(x + (j - 1) * 0.27, [g.summary[(w, pol, p)][0] for pol in g.policies], 0.27, label=p[-3:].upper())
        ax.set_xticks(x, g.policies, rotation=70, fontsize=7)
        ax.set(title=w, ylabel="TTFT (s)")
    axes[0][0].legend(fontsize=7)
    return fig


def _bars_figure(plt: Any, g: Grid, metric: str, ylabel: str) -> Figure:
    fig, ax = plt.subplots(figsize=(g.wide, 4.5))
    _grouped_bars(ax, g.summary, g.workloads, g.policies, metric, ylabel=ylabel)
    ax.legend(fontsize=7, ncol=4)
    return fig


def throughput(plt: Any, g: Grid) -> Figure:
    return _bars_figure(plt, g, "throughput_rps", metric_of("throughput_rps").header)


def itl_cv(plt: Any, g: Grid) -> Figure:
    return _bars_figure(plt, g, "itl_cv", metric_of("itl_cv").header)


def itl_distribution(plt: Any, g: Grid) -> Figure:
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(g.policies) + 2), 4.5))
    samples = [np.concatenate([r.itl_sample for r in g.results if r.workload == g.focus and r.policy == p]) * 1e3
               for p in g.policies]
    ax.boxplot(samples, showfliers=False)
    ax.set_xticks(np.arange(1, len(g.policies) + 1), g.policies, rotation=60, fontsize=8)
    ax.set(ylabel="inter-token latency (ms)", title=f"ITL distribution ({g.focus}, all seeds)")
    return fig


def twp_feedback(plt: Any, g: Grid) -> Figure | None:
    """TWP's window against its token load, with batch, queue and KV use (runs whose policy reports a window)."""
    series = next((r.series for r in g.focus_runs() if "window" in r.series), None)
    if not series:
        return None
    fig, axes = plt.subplots(4, 1, figsize=(9, 8), sharex=True)
    t = series["time_s"]
    axes[0].plot(t, series["window"], label="window H_t")
    axes[0].plot(t, series["token_load"], label="token load K_t", alpha=0.7)
    axes[0].set_ylabel("tokens")
    axes[0].legend(fontsize=8)
    for ax, key, label in zip(axes[1:], ("batch", "queue", "kv_used"), ("batch size", "queue depth", "KV used"),
                              strict=True):
        ax.plot(t, series[key])
        ax.set_ylabel(label)
    axes[-1].set_xlabel("time (s)")
    axes[0].set_title(f"TWP feedback loop ({g.focus}, seed {g.first_seed})")
    return fig


def flow_control_panels(plt: Any, g: Grid) -> Figure:
    fig, axes = plt.subplots(2, 2, figsize=(max(10, g.wide), 7))
    panels = ("e2e_mean_all_s", "e2e_p95_all_s", "throughput_rps", "throughput_tps")
    for ax, metric in zip(axes.ravel(), panels, strict=True):
        _grouped_bars(ax, g.summary, g.workloads, g.policies, metric, ylabel=metric_of(metric).header)
    axes[0][0].legend(fontsize=6, ncol=3)
    return fig


FIGURES: dict[str, Callable[[Any, Grid], Figure | None]] = {
    "fig4_ttft_per_request.png": ttft_per_request,
    "fig5_ttft_percentiles.png": ttft_percentiles,
    "fig6_throughput.png": throughput,
    "fig7_itl_distribution.png": itl_distribution,
    "fig8_itl_cv.png": itl_cv,
    "twp_feedback.png": twp_feedback,
    "flow_control_panels.png": flow_control_panels,
}
"""File name -> figure builder; a builder returns None when the runs hold nothing for it to draw."""


def plot_all(results: list[TaskResult], summary: Summary, out: Path) -> list[Path]:
    """Draw every figure in :data:`FIGURES` into ``out``; return the files written."""
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    workloads, policies = ordered(results)
    grid = Grid(results, summary, workloads, policies, focus_workload(workloads), min(r.seed for r in results))
    written = []
    for name, build in FIGURES.items():
        fig = build(plt, grid)
        if fig is None:
            continue
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)
    return written


def learning_curves(runs: Sequence[str | Path], out: str | Path, references: dict[str, float] | None = None,
                    title: str = "", log_steps: bool = False, labels: Sequence[str] | None = None) -> Path:
    """Each training run's validation return over timesteps (its ``eval.csv``), labelled by ``labels`` (default:
    the run's seed, ``s0``), with horizontal lines for ``references`` (label -> validation return), written as a
    PNG (``log_steps``: timesteps on a log scale, linear below 10,000 so a warm start's step 0 stays, so 100k, 1M
    and 10M budgets share one plot); return its path."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    values = []
    for k, run in enumerate(runs):
        rows = np.loadtxt(Path(run) / "eval.csv", delimiter=",", ndmin=2)
        label = labels[k] if labels is not None else Path(run).name.rsplit("__", 1)[-1]
        ax.plot(rows[:, 0], rows[:, 1], marker="o", label=label)
        values += rows[:, 1].tolist()
    references = references or {}
    if values and references:  # the runs and the best reference in view; farther references named at the edge
        lo, hi = min(values), max(*values, max(references.values()))
        pad = 0.1 * (hi - lo) or 1.0
        ax.set_ylim(lo - pad, hi + pad)
    off = []
    for label, value in references.items():
        if values and not ax.get_ylim()[0] <= value <= ax.get_ylim()[1]:
            off.append(f"{label} {value:,.0f}")
            continue
        ax.axhline(value, linestyle="--", color="grey")
        ax.annotate(label, xy=(0.01, value), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
    if off:
        ax.annotate("below the axis: " + ", ".join(off), xy=(0.01, 0.01), xycoords="axes fraction", fontsize=7)
    if log_steps:
        ax.set_xscale("symlog", linthresh=10_000)
        ax.set_xlim(left=0)
    ax.set_xlabel("timesteps (env steps trained)")
    ax.set_ylabel("validation return (mean over the validation seeds)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
