"""``servegym tasks``: the benchmark tasks, what makes each hard, and (from a leaderboard) its headroom."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from servegym.envs.tasks import TASKS, TEST_SEEDS, TRAIN_SEEDS, VALIDATION_SEEDS, Task
from servegym.workloads.scenarios import profile_for

DEFAULT_LEADERBOARD = Path("docs/bench/leaderboard.csv")


def _setting(task: Task) -> str:
    if task.is_mixture:
        return f"mixture of {', '.join(task.components)}"
    parts = [f"workload={task.workload}", f"profile={task.profile or profile_for(task.workload)}",
             f"reward={task.reward}"]
    parts += [f"{k}={v}" for k, v in {**task.engine, **{f"pool.{k}": v for k, v in task.pool.items()}}.items()]
    parts.append(f"max_steps={task.max_steps}, idle_guard_steps={task.idle_guard_steps}")
    return ", ".join(parts)


def cmd_tasks(args: argparse.Namespace) -> int:
    headroom = _headroom(Path(args.leaderboard)) if args.leaderboard else {}
    for task in TASKS.values():
        print(f"{task.name}")
        print(textwrap.fill(task.summary, 104, initial_indent="    hard: ", subsequent_indent="          "))
        print(textwrap.fill(_setting(task), 104, initial_indent="    set:  ", subsequent_indent="          "))
        seeds = task.test_seeds
        print(f"    test: {len(seeds)} seeds, {seeds[0]}..{seeds[-1]}, no request in two of them")
        if task.name in headroom:
            print(f"    headroom: {headroom[task.name]}")
    print(f"\nseeds: train {TRAIN_SEEDS.start}-{TRAIN_SEEDS.stop - 1}, validation {VALIDATION_SEEDS[0]}-"
          f"{VALIDATION_SEEDS[-1]}, test {TEST_SEEDS[0]}-{TEST_SEEDS[-1]} (frozen; servegym bench reports on "
          "each task's own, above)")
    if not headroom:
        print("headroom: run `servegym bench` and pass --leaderboard bench/leaderboard.csv")
    return 0


def _headroom(path: Path) -> dict[str, str]:
    from servegym.benchmark.bench import headroom_lines

    if not path.is_file():
        raise ValueError(f"no leaderboard at {path}; run `servegym bench --out {path.parent}` first")
    return headroom_lines(path)


def add_tasks_parser(sub: Any) -> None:
    tasks = sub.add_parser("tasks", help="list the benchmark tasks (gym.make(..., task=NAME))")
    tasks.add_argument("--leaderboard", default=str(DEFAULT_LEADERBOARD) if DEFAULT_LEADERBOARD.is_file() else None,
                       help=f"leaderboard.csv to read each task's headroom from (default {DEFAULT_LEADERBOARD} "
                            "when it exists)")
    tasks.set_defaults(func=cmd_tasks)
