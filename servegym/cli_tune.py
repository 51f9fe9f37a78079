"""``servegym tune``: an Optuna study over a policy's search space."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servegym.cli_args import add_config_args, config_args, writable_dir
from servegym.engine.config import LENGTH_MODES
from servegym.envs.tasks import TASKS
from servegym.policies import POLICIES
from servegym.tuning.study import TuneConfig
from servegym.workloads import WORKLOADS

if TYPE_CHECKING:
    import optuna

TUNE_FLAGS = ("objective", "trials", "seeds", "eval_seeds", "storage", "pruner", "sampler", "sampler_seed", "max_steps")
"""``servegym tune``'s flags that mirror ``TuneConfig`` fields (type, default and help from the field)."""


def cmd_tune(args: argparse.Namespace) -> int:
    from servegym.tuning import TuningInterrupted, finished_trials, fresh_seed, tune
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
    out = Path(args.out or f"studies/{cfg.name}")
    made = _missing_folders(out)
    if not args.no_report:
        writable_dir(out)  # before the first trial, not after the last
    wanted = f"up to {cfg.trials} finished trials" if cfg.trials else "report only"
    print(f"servegym tune: study {cfg.name} at {cfg.storage_label()}: {wanted}, {cfg.seeds} episodes each, "
          f"sampler seed {seed}", flush=True)
    try:
        with _optuna_lines(not args.quiet):
            study = tune(cfg, progress=not args.quiet)
        if cfg.trials:
            held = finished_trials(study)
            short = "" if held >= cfg.trials else " (failed trials, and those other workers are still running, are " \
                "not counted: run again to finish the count)"
            print(f"servegym tune: study {cfg.name} holds {held} finished trials of the {cfg.trials} wanted{short}",
                  flush=True)
        if args.no_report:
            return 0
        summary = report(cfg, study, out)
    except TuningInterrupted as stop:
        _remove_empty(made)
        kept = "its" if stop.study is None else _its_finished(stop.study)
        again = f"to finish the {cfg.trials}, or with --trials 0 to report" if cfg.trials else "to report"
        print(f"servegym tune: stopped by {stop.signal_name}; study {cfg.name} at {cfg.storage_label()} keeps {kept} "
              f"finished trials (a trial cut short is stored as pruned and not counted); run the same command again "
              f"{again}", file=sys.stderr)
        return stop.exit_status
    except BaseException:
        _remove_empty(made)  # a failed command leaves no empty report folder behind
        raise
    print((out / "report.md").read_text())
    print(f"wrote {out}/best_params.json (use with servegym run/compare --params) and {out}/report.md")
    print(f"wall time per trial: {summary['wall_s_per_trial']:.2f} s")
    return 0


@contextlib.contextmanager
def _optuna_lines(shown: bool) -> Iterator[None]:
    """Optuna's line per trial (its INFO log) shown or not, for the length of the block."""
    import optuna

    verbosity = optuna.logging.get_verbosity()
    if not shown:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def _its_finished(study: optuna.Study) -> str:
    """"its N" for the study's finished trials, or "its" where a forced stop left the storage mid-transaction."""
    from servegym.tuning import finished_trials

    try:
        return f"its {finished_trials(study)}"
    except Exception:
        return "its"


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    return [p for p in (path, *path.parents) if not p.exists()]


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders (deepest first) that this command made and left empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def add_tune_parser(sub: Any) -> None:
    """``servegym tune`` on ``sub``, the ``servegym`` parser's sub-parsers action."""
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
    tun.add_argument("--quiet", action="store_true", help="no progress bar and no Optuna line per trial")
    tun.set_defaults(func=cmd_tune)
