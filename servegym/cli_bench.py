"""``servegym bench``: the leaderboard of policies over the benchmark tasks, on the frozen test seeds."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

from servegym.benchmark.bench import (
    DEFAULT_POLICIES,
    BenchJob,
    Entry,
    make_entries,
    make_jobs,
    run_bench,
    task_test_seeds,
    write_leaderboard,
)
from servegym.benchmark.budgets import training_budget, write_budgets, write_curves
from servegym.cli_args import add_executor_args, executor_from_args, writable_dir
from servegym.envs.tasks import TASKS, TEST_SEEDS
from servegym.evaluation.executor import Executor, FolderLock, Interrupted, JobFailed, RunStore
from servegym.evaluation.stats import MIN_VERDICT_SEEDS
from servegym.validation import count_arg


def command_line(args: argparse.Namespace) -> str:
    """The options that shaped the leaderboard, as a command a reader can rerun."""
    parts = ["servegym", "bench"]
    for option, values in (("--tasks", args.tasks), ("--policies", args.policies), ("--params", args.params),
                           ("--rl", args.rl)):
        if values:
            parts += [option, *values]
    if args.tuned:
        parts += ["--tuned", args.tuned]
    if args.seeds is not None:
        parts += ["--seeds", str(args.seeds)]
    return shlex.join([*parts, "--out", args.out])


def cmd_bench(args: argparse.Namespace) -> int:
    if args.verify:
        return _verify(args)
    if args.agent:
        return _submit(args)
    # Everything is checked before the first episode: a typo should not cost a run.
    if args.curves and not args.rl:
        raise ValueError("--curves draws trained agents' validation returns against their budgets: give --rl RUN ...")
    executor = executor_from_args(args)
    tasks = args.tasks or list(TASKS)
    if args.seeds is not None and args.seeds > len(TEST_SEEDS):
        raise ValueError(f"--seeds {args.seeds}: there are only {len(TEST_SEEDS)} test seeds")
    seeds = {task: task_test_seeds(task, args.seeds) for task in tasks}
    entries = make_entries(args.policies or DEFAULT_POLICIES, args.params or (), args.rl or (), args.tuned, tasks)
    jobs = make_jobs(tasks, entries, max_seeds=args.seeds)
    out = Path(args.out)
    writable_dir(out)
    with FolderLock(out):  # one bench writes a folder at a time
        return _run_and_write(args, executor, tasks, entries, seeds, jobs, out)


def _run_and_write(args: argparse.Namespace, executor: Executor, tasks: list[str], entries: list[Entry],
                   seeds: dict[str, tuple[int, ...]], jobs: list[BenchJob], out: Path) -> int:
    """Run the missing episodes into ``out`` (locked by the caller) and write the leaderboard."""
    if executor.kind == "ray":
        where = f"as Ray tasks{f' ({args.workers} at a time)' if args.workers else ''}"
    else:
        where = f"on {min(args.workers or os.cpu_count() or 1, len(jobs))} workers"
    counts = sorted({len(s) for s in seeds.values()})
    shown = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    print(f"servegym bench: {len(tasks)} tasks, {len(entries)} policies, {shown} test seeds per task: {len(jobs)} "
          f"episodes {where}", flush=True)
    if counts[0] < MIN_VERDICT_SEEDS:
        print(f"servegym bench: no decision-sensitivity verdicts from {counts[0]} seed{'s' * (counts[0] != 1)} "
              f"(a verdict needs at least {MIN_VERDICT_SEEDS}); the tables are written as usual", flush=True)
    for stale in ("leaderboard.csv", "leaderboard.md"):  # never mistaken for this run's results
        (out / stale).unlink(missing_ok=True)
    store = RunStore(out / "runs")
    if args.fresh:
        store.clear()
    try:
        rows = run_bench(tasks, entries, workers=args.workers, progress=not args.quiet, store=store,
                         executor=executor, max_seeds=args.seeds)
    except (Interrupted, JobFailed) as stop:
        done = [stop.results[i] for i in sorted(stop.results)]
        if done:
            write_leaderboard(done, out, command_line(args), partial=(len(done), len(jobs)))
        raise
    agents = [e for e in entries if e.policy.startswith("rl:") and any(e.runs_on(task) for task in tasks)]
    budgets = [training_budget(e) for e in agents]
    csv_path, md_path = write_leaderboard(rows, out, command_line(args), budgets=budgets)
    print(md_path.read_text())
    print(f"wrote {csv_path} (one row per episode) and {md_path}")
    if budgets:
        print(f"wrote {write_budgets(budgets, out)} (each agent's env steps and wall time)")
    if args.curves:
        for path in write_curves(agents, rows, out):
            print(f"wrote {path} (validation return against training budget)")
    return 0


def _submit(args: argparse.Namespace) -> int:
    """``--agent RUN``: the agent's test-track rows on its task, stamped, in ``<out>/submission.json``."""
    from servegym.benchmark.submission import agent_entry, submit, write_submission

    if args.seeds is not None:
        raise ValueError("--seeds with --agent: a submission holds all of its task's test seeds")
    agent_entry(args.agent)  # a run that cannot be submitted is refused before anything is made
    writable_dir(Path(args.out))  # before the test episodes run
    submission = submit(args.agent, None, args.workers, progress=not args.quiet)
    path = write_submission(submission, Path(args.out) / "submission.json")
    returns = [row["episode_return"] for row in submission["rows"]]
    print(f"{submission['task']}: {len(returns)} test seeds, mean return {sum(returns) / len(returns):.1f} "
          f"(servegym {submission['servegym_version']}, {submission['commit']}, {submission['env_id']})")
    print(f"wrote {path}; check it with: servegym bench --verify {path}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    """``--verify FILE``: replay the submission's agent and compare every number; exit 1 on any difference."""
    from servegym.benchmark.submission import read_submission, verify

    problems = verify(args.verify, args.agent, args.workers)
    rows = len(read_submission(args.verify)["rows"])
    if problems:
        print(f"NOT verified: {len(problems)} difference(s) in {args.verify}:\n  " + "\n  ".join(problems[:20]))
        return 1
    print(f"verified: all {rows} rows of {args.verify} replay exactly")
    return 0


def add_bench_parser(sub: Any) -> None:
    """Add ``servegym bench`` to ``sub`` (the parser's ``add_subparsers()`` result)."""
    bench = sub.add_parser("bench", help="leaderboard: policies x benchmark tasks x frozen test seeds")
    bench.add_argument("--tasks", nargs="+", default=None, choices=list(TASKS),
                       help="tasks to run (default: all)")
    bench.add_argument("--policies", nargs="+", default=None,
                       help=f"policies with default parameters, or rl:RUN_DIR (default: {' '.join(DEFAULT_POLICIES)})")
    bench.add_argument("--params", nargs="+", default=None, metavar="FILE",
                       help="params files (servegym tune's best_params.json): each adds '<policy> (tuned)'")
    bench.add_argument("--tuned", default=None, metavar="DIR",
                       help="per-task tuned parameters: DIR/<policy>-<task>/best_params.json adds '<policy> (tuned)' "
                            "on that task (servegym tune --task T --out DIR/<policy>-<task>)")
    bench.add_argument("--rl", nargs="+", default=None, metavar="RUN",
                       help="servegym train run folders: each adds 'rl:<run name>'")
    bench.add_argument("--seeds", type=count_arg("seeds"), default=None,
                       help="use the first N of each task's test seeds (default: all of them, "
                            "servegym tasks lists how many)")
    bench.add_argument("--workers", type=count_arg("workers"), default=None,
                       help="episodes at once (default: all cores; with --executor ray, all the cluster's)")
    add_executor_args(bench)
    bench.add_argument("--out", default="bench", help="folder for leaderboard.csv and leaderboard.md")
    bench.add_argument("--fresh", action="store_true",
                       help="forget the episodes kept in <out>/runs (default: resume, running only what is missing)")
    bench.add_argument("--agent", default=None, metavar="RUN",
                       help="submit a trained agent: its test-track rows on its task, stamped with the version, "
                            "commit, env id and task settings, in <out>/submission.json (with --verify: the run "
                            "to replay instead of the one the file names)")
    bench.add_argument("--verify", default=None, metavar="FILE",
                       help="replay a submission's agent on its seeds and check every number (exit 1 if any differ)")
    bench.add_argument("--curves", action="store_true",
                       help="with --rl: per task, learning_curves_<task>.png, each agent's validation return against "
                            "its training steps (log scale) with the tuned heuristics' validation returns as lines")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)
