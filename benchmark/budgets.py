"""Trained agents' budgets on the board: the env steps and wall time each took (its run's ``config.json``), and
its validation return against budget beside the tuned heuristics' (``servegym bench --curves``)."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import numpy as np

from servegym.benchmark.bench import BenchRow, Entry
from servegym.benchmark.board import VALIDATION_SUFFIX, is_heuristic
from servegym.rl.runs import run_record

BUDGETS_FILE = "training_budgets.csv"


@dataclass(frozen=True)
class TrainingBudget:
    """What an agent's training cost, as its run recorded it (-1 steps and NaN seconds where its record lacks them)."""

    label: str
    task: str
    timesteps: int
    """Env steps trained (``timesteps_done``: what the model saw, which can pass the steps asked by a rollout)."""
    wall_s: float
    """Seconds the training calls ran, summed over resumes."""
    n_envs: int
    vec_env: str
    """``native`` or ``subprocess`` (one env is always ``native``); for a run made before the choice existed,
    ``subprocess`` with more than one env (what it used) and ``dummy`` with one."""


def training_budget(entry: Entry) -> TrainingBudget:
    """The budget of a trained agent's entry (``rl:RUN``), from its ``config.json``."""
    data = run_record(_run(entry))
    n_envs = int(data.get("n_envs") or 1)
    before = "subprocess" if n_envs > 1 else "dummy"  # what a run made before the vec_env field used
    # One env never starts a worker: it steps in the training process, whatever the flag said.
    vec_env = "native" if n_envs == 1 and "vec_env" in data else data.get("vec_env") or before
    done = data.get("timesteps_done")
    return TrainingBudget(entry.label, str(data.get("task") or ""), int(done) if done is not None else -1,
                          float(data.get("wall_s") or math.nan), n_envs, str(vec_env))


def budget_lines(budgets: Sequence[TrainingBudget]) -> list[str]:
    """The board's table of agents' training budgets (none: no lines)."""
    if not budgets:
        return []
    lines = ["", "## Trained agents' budgets", "",
             "What each agent's training cost, from its run's `config.json`: env steps seen and the wall seconds its "
             "training calls ran (on the machine that trained it). Compare agents at equal budgets.", "",
             "| agent | task | env steps | wall time | env steps/s | envs |", "|---|---|---:|---:|---:|---|"]
    for b in sorted(budgets, key=lambda b: (b.task, b.label)):
        steps = f"{b.timesteps:,}" if b.timesteps >= 0 else "?"
        wall = "?" if not math.isfinite(b.wall_s) else (f"{b.wall_s:.0f} s" if b.wall_s < 120 else
                                                        f"{b.wall_s / 60:.1f} min")
        rate = f"{b.timesteps / b.wall_s:,.0f}" if b.timesteps >= 0 and b.wall_s > 0 else "?"
        lines.append(f"| {b.label} | {b.task} | {steps} | {wall} | {rate} | {b.n_envs} ({b.vec_env}) |")
    return lines


def write_budgets(budgets: Sequence[TrainingBudget], out: Path) -> Path:
    """``training_budgets.csv`` in ``out``: one row per agent (:class:`TrainingBudget`'s fields)."""
    path = out / BUDGETS_FILE
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([f.name for f in fields(TrainingBudget)])
        writer.writerows(astuple(b) for b in budgets)
    os.replace(tmp, path)
    return path


def heuristic_validation_returns(rows: Sequence[BenchRow], task: str) -> dict[str, float]:
    """The tuned heuristics' mean validation return on ``task`` (their ``validation``-track episodes), by label."""
    returns: dict[str, list[float]] = {}
    for row in rows:
        if row.task == task and row.policy.endswith(VALIDATION_SUFFIX):
            label = row.policy.removesuffix(VALIDATION_SUFFIX)
            if is_heuristic(label) and label.endswith("(tuned)"):
                returns.setdefault(label, []).append(row.episode_return)
    return {label: float(np.mean(values)) for label, values in sorted(returns.items())}


def write_curves(entries: Sequence[Entry], rows: Sequence[BenchRow], out: Path) -> list[Path]:
    """Per task with trained agents, ``learning_curves_<task>.png``: each agent's validation return against the
    env steps it had trained (its ``eval.csv``, log scale), the tuned heuristics' validation returns as
    horizontal lines; return the files written."""
    from servegym.evaluation.plots import learning_curves

    by_task: dict[str, list[Entry]] = {}
    for entry in entries:
        if entry.policy.startswith("rl:") and entry.tasks and (_run(entry) / "eval.csv").is_file():
            by_task.setdefault(entry.tasks[0], []).append(entry)
    return [learning_curves([_run(e) for e in agents],
                            out / f"learning_curves_{task}.png", heuristic_validation_returns(rows, task),
                            title=f"{task}: validation return against training budget", log_steps=True,
                            labels=[e.label for e in agents])
            for task, agents in sorted(by_task.items())]


def _run(entry: Entry) -> Path:
    """A trained agent's run folder (its entry's policy is ``rl:RUN``)."""
    return Path(entry.policy.removeprefix("rl:"))
