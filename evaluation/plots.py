"""The papers' figures as PNG files (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servegym.evaluation.grid import TaskResult
from servegym.evaluation.report import Summary, ordered


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def focus_workload(workloads: list[str]) -> str:
    """The workload the single-workload figures show: a burst scenario when there is one."""
    return next((w for w in workloads if "burst" in w), workloads[0])


def _grouped_bars(ax, summary: Summary, workloads, policies, metric, scale=1.0, ylabel=""):
    width = 0.8 / len(policies)
    x = np.arange(len(workloads))
    for i, policy in enumerate(policies):
        means = np.array([summary[(w, policy, metric)][0] for w in workloads]) * scale
        halves = np.nan_to_num(np.array([summary[(w, policy, metric)][1] for w in workloads]) * scale)
        ax.bar(x + (i - (len(policies) - 1) / 2) * width, means, width, yerr=halves, label=policy, capsize=2)
    ax.set_xticks(x, workloads, rotation=15)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def plot_all(results: list[TaskResult], summary: Summary, out: Path) -> list[Path]:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    workloads, policies = ordered(results)
    focus = focus_workload(workloads)
    first_seed = min(r.seed for r in results)
    written = []
    wide = max(8.0, min(16.0, 0.25 * len(policies) * len(workloads) + 3))

    def save(fig, name):
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in results:
        if r.workload == focus and r.seed == first_seed:
            ax.plot(np.arange(r.ttft_by_request.size), r.ttft_by_request, lw=1, label=r.policy)
    ax.set(xlabel="request index", ylabel="TTFT (s)", title=f"TTFT per request ({focus}, seed {first_seed})")
    ax.legend(fontsize=7, ncol=2)
    save(fig, "fig4_ttft_per_request.png")

    fig, axes = plt.subplots(1, len(workloads), figsize=(max(6, 4 * len(workloads)), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        x = np.arange(len(policies))
        for j, p in enumerate(("ttft_p50", "ttft_p95", "ttft_p99")):
            ax.bar(x + (j - 1) * 0.27, [summary[(w, pol, p)][0] for pol in policies], 0.27, label=p[-3:].upper())
        ax.set_xticks(x, policies, rotation=70, fontsize=7)
        ax.set(title=w, ylabel="TTFT (s)")
    axes[0][0].legend(fontsize=7)
    save(fig, "fig5_ttft_percentiles.png")

    fig, ax = plt.subplots(figsize=(wide, 4.5))
    _grouped_bars(ax, summary, workloads, policies, "throughput_rps", ylabel="throughput (req/s)")
    ax.legend(fontsize=7, ncol=4)
    save(fig, "fig6_throughput.png")

    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(policies) + 2), 4.5))
    samples = [np.concatenate([r.itl_sample for r in results if r.workload == focus and r.policy == p]) * 1e3
               for p in policies]
    ax.boxplot(samples, showfliers=False)
    ax.set_xticks(np.arange(1, len(policies) + 1), policies, rotation=60, fontsize=8)
    ax.set(ylabel="inter-token latency (ms)", title=f"ITL distribution ({focus}, all seeds)")
    save(fig, "fig7_itl_distribution.png")

    fig, ax = plt.subplots(figsize=(wide, 4.5))
    _grouped_bars(ax, summary, workloads, policies, "itl_cv", ylabel="ITL coefficient of variation")
    ax.legend(fontsize=7, ncol=4)
    save(fig, "fig8_itl_cv.png")

    series = next((r.series for r in results if "window" in r.series and r.workload == focus
                   and r.seed == first_seed), None)
    if series:
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
        axes[0].set_title(f"TWP feedback loop ({focus}, seed {first_seed})")
        save(fig, "twp_feedback.png")

    fig, axes = plt.subplots(2, 2, figsize=(max(10, wide), 7))
    panels = (("e2e_mean", "average latency (s)"), ("e2e_p95", "P95 latency (s)"),
              ("throughput_rps", "request throughput (req/s)"), ("throughput_tps", "token throughput (tok/s)"))
    for ax, (metric, label) in zip(axes.ravel(), panels, strict=True):
        _grouped_bars(ax, summary, workloads, policies, metric, ylabel=label)
    axes[0][0].legend(fontsize=6, ncol=3)
    save(fig, "flow_control_panels.png")
    return written
