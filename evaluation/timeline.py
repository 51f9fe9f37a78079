"""``timeline.png``: an episode at a glance. Requests as horizontal bars coloured by phase (the spans of
:mod:`servegym.evaluation.trace`), and below them, on the same time axis, KV blocks in use and queue length per
container. Several episodes (one per policy) go side by side, one column each."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servegym.engine import STEP_INDEX, EpisodeLog
from servegym.evaluation.trace import PHASES, episode_end, request_spans

if TYPE_CHECKING:
    from servegym.evaluation.spec import Experiment

PHASE_COLOURS = {"waiting": "#9e9e9e", "prefill": "#ff9800", "decoding": "#4caf50", "preempted": "#e53935",
                 "resumed": "#8e24aa"}


def _requests(ax, log: EpisodeLog) -> None:
    spans, rejected = request_spans(log)
    for phase in PHASES:
        chosen = [s for s in spans if s.phase == phase]
        if chosen:
            ax.hlines([s.request for s in chosen], [s.start_s for s in chosen], [s.end_s for s in chosen],
                      colors=PHASE_COLOURS[phase], linewidth=1.2, label=phase)
    if rejected:
        ax.scatter(log.arrival_s[rejected], rejected, marker="x", c="k", s=8, label="rejected")
    ax.set_ylabel("request (by arrival)")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper right", ncol=3)


def _load(kv_ax, queue_ax, log: EpisodeLog) -> None:
    for c in range(log.num_containers):
        steps = log.steps(c)
        if not steps.size:
            continue
        end = steps[:, STEP_INDEX["end_s"]]
        kv_ax.step(end, steps[:, STEP_INDEX["num_used_blocks"]] / log.kv_blocks(c), where="pre", lw=0.8,
                   label=f"container {c}")
        queue_ax.step(end, steps[:, STEP_INDEX["num_waiting"]], where="pre", lw=0.8, label=f"container {c}")
    kv_ax.set(ylabel="KV in use", ylim=(0, 1.05))
    queue_ax.set(ylabel="queue length", xlabel="simulated time (s)")
    if log.num_containers > 1:
        kv_ax.legend(fontsize=7)


def plot_timeline(episodes: dict[str, EpisodeLog], path: str | Path) -> Path:
    """One column per episode (``label -> log``): requests by phase, KV in use, queue length; time axes shared
    within a column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not episodes:
        raise ValueError("plot_timeline needs at least one episode")
    columns = len(episodes)
    fig, axes = plt.subplots(3, columns, figsize=(7 * columns, 7.5), sharex="col", squeeze=False,
                             gridspec_kw={"height_ratios": [4, 1, 1]})
    for col, (label, log) in enumerate(episodes.items()):
        top, kv, queue = axes[:, col]
        _requests(top, log)
        _load(kv, queue, log)
        top.set_title(f"{label}: {log.num_requests} requests, {episode_end(log):.1f} s", fontsize=9)
        top.set_xlim(0, max(episode_end(log), float(np.nanmax(log.arrival_s, initial=0.0))) * 1.01 or 1.0)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_policies(experiment: Experiment, path: str | Path) -> Path:
    """Each policy of ``experiment`` side by side on its focus workload (a burst one when there is one) and its
    first seed, on the grid's own settings."""
    from servegym.evaluation.grid import episode, tasks
    from servegym.evaluation.plots import focus_workload

    todo = tasks(experiment)
    workload = focus_workload([t.workload.label for t in todo])
    seed = experiment.seeds[0]
    chosen = [t for t in todo if t.workload.label == workload and t.seed == seed]
    return plot_timeline({f"{t.policy.title} on {workload}, seed {seed}": episode(t)[1].log for t in chosen}, path)
