"""``servegym tune``: an Optuna study over a policy's search space."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servegym.cli_args import add_config_args, config_args
from servegym.engine.config import LENGTH_MODES
from servegym.envs.tasks import TASKS
from servegym.policies import POLICIES
from servegym.tuning.study import TuneConfig
from servegym.workloads import WORKLOADS

TUNE_FLAGS = ("objective", "trials", "seeds", "eval_seeds", "storage", "pruner", "sampler", "sampler_seed", "max_steps")
"""``servegym tune``'s flags that mirror ``TuneConfig`` fields (type, default and help from the field)."""


def cmd_tune(args: argparse.Namespace) -> int:
    from servegym.tuning import TuningInterrupted, fresh_seed, tune
    from servegym.tuning.report import report

    if args.trials == 0 and args.no_report:
        raise ValueError("--trials 0 only reports on a study; with --no-report there is nothing to do")
    engine = {"length_mode": args.length_mode} if args.length_mode else {}
    env: dict = {"engine": engine} if engine else {}
    workload, study = args.workload, args.study
    if args.task:
        from servegym.envs.tasks import get_task

        task = get_task(args.task)
        # A mixture's episodes draw their component, and with it the workload, from the seed.
        env["task"], workload = task.name, (None if task.is_mixture else task.workload)
        study = study or f"{args.policy}-{task.name}-{args.objective}"
    seed = args.sampler_seed if args.sampler_seed is not None else fresh_seed()
    cfg = TuneConfig(policy=args.policy, workload=workload, study_name=study, env=env,
                     **{**config_args(args, TUNE_FLAGS), "sampler_seed": seed})
    print(f"servegym tune: study {cfg.name} at {cfg.storage_label()}: {cfg.trials} trials of {cfg.seeds} episodes, "
          f"sampler seed {seed}", flush=True)
    try:
        study = tune(cfg, progress=not args.quiet)
    except TuningInterrupted as stop:
        print(f"servegym tune: stopped by {stop}; the finished trials are kept in study {cfg.name} at "
              f"{cfg.storage_label()} (run again to resume, --trials 0 to report)", file=sys.stderr)
        return stop.exit_status
    if args.no_report:
        return 0
    out = Path(args.out or f"studies/{cfg.name}")
    summary = report(cfg, study, out)
    print((out / "report.md").read_text())
    print(f"wrote {out}/best_params.json (use with servegym run/compare --params) and {out}/report.md")
    print(f"wall time per trial: {summary['wall_s_per_trial']:.2f} s")
    return 0


def add_tune_parser(sub: argparse._SubParsersAction) -> None:
    tun = sub.add_parser("tune", help="Optuna study over a policy's search space")
    tun.add_argument("--policy", required=True, choices=sorted(n for n, c in POLICIES.items() if c.search_space))
    tun.add_argument("--workload", default="burst", choices=sorted(WORKLOADS))
    tun.add_argument("--task", default=None, choices=sorted(TASKS),
                     help="tune on a benchmark task's env (its workload, profile, engine, pool and reward); with "
                          "--objective return this is the leaderboard's ranking")
    add_config_args(tun, TuneConfig, TUNE_FLAGS)
    tun.add_argument("--study", default=None,
                     help="study name (default <policy>-<workload or task>-<objective>)")
    tun.add_argument("--length-mode", choices=LENGTH_MODES, default=None)
    tun.add_argument("--out", default=None, help="report folder (default studies/<study>)")
    tun.add_argument("--no-report", action="store_true", help="only add trials (for extra workers)")
    tun.add_argument("--quiet", action="store_true")
    tun.set_defaults(func=cmd_tune)
