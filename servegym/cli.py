"""The ``servegym`` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from servegym.backends import load_profile, shipped_profiles
from servegym.cli_args import (
    add_config_args,
    add_executor_args,
    config_args,
    executor_from_args,
    json_object,
    non_negative_int,
    positive_int,
    writable_dir,
)
from servegym.cli_bench import add_bench_parser
from servegym.cli_profile import add_profile_parser
from servegym.cli_real import add_real_backend_parsers
from servegym.cli_tasks import add_tasks_parser
from servegym.engine import EngineConfig
from servegym.engine.config import LENGTH_MODES
from servegym.envs.tasks import TASKS
from servegym.evaluation.executor import (
    FolderLock,
    Interrupted,
    InterruptOnTerm,
    JobFailed,
    exit_status,
    signal_of,
)
from servegym.evaluation.stats import MIN_VERDICT_SEEDS
from servegym.experiments import FOLDER as SHIPPED_EXPERIMENTS
from servegym.experiments import find_experiment, shipped_experiments
from servegym.metrics import metric
from servegym.policies import POLICIES, make_policy, policies_table
from servegym.rl.config import TrainConfig
from servegym.runner import make_env, run_episode, write_csvs
from servegym.stability import workload_stability
from servegym.tuning.study import TuneConfig
from servegym.workloads import WORKLOADS, make_workload
from servegym.workloads.scenarios import profile_for

TRAIN_FLAGS = ("timesteps", "seed", "n_envs", "max_episode_steps", "eval_freq", "eval_episodes", "checkpoint_freq",
               "reward_scale", "observation", "out")
"""``servegym train``'s flags that mirror ``TrainConfig`` fields (type, default and help from the field)."""
TUNE_FLAGS = ("objective", "trials", "seeds", "eval_seeds", "storage", "pruner", "sampler", "sampler_seed", "max_steps")
"""``servegym tune``'s flags that mirror ``TuneConfig`` fields (type, default and help from the field)."""
SUMMARY_METRICS = ("num_requests", "num_finished", "num_rejected", "num_unfinished", "makespan_s", "throughput_rps",
                   "throughput_tps", "goodput_rps", "ttft_p50", "ttft_p95", "ttft_p99", "e2e_p50", "e2e_p99",
                   "itl_mean", "itl_p50", "itl_p99", "itl_cv", "kv_util_mean", "kv_util_max", "num_preemptions",
                   "queue_slope_rps")
"""What ``servegym run`` prints, in order (headers and formats from ``servegym.metrics.METRICS``)."""


def format_summary(summary: dict[str, float]) -> str:
    return "\n".join(f"  {metric(k).header:<22} {metric(k).format(summary[k]):>12}" for k in SUMMARY_METRICS)


def cmd_run(args: argparse.Namespace) -> int:
    for folder in ([Path(args.out)] if args.out else []) + ([Path(args.trace).parent] if args.trace else []):
        writable_dir(folder)  # before the episode runs
    params = {}
    if args.params:
        from servegym.tuning.study import read_params

        name, params = read_params(args.params)
        if name != args.policy:
            raise ValueError(f"{args.params} holds parameters of {name!r}, not of --policy {args.policy!r}")
    policy = make_policy(args.policy, **params)
    mode = args.length_mode or ("predicted" if policy.uses_output_lengths else EngineConfig().length_mode.value)
    mode = policy.engine_overrides().get("length_mode", mode)  # a policy's own setting wins (an rl: agent's)
    engine = {"length_mode": mode}
    args.profile = args.profile or profile_for(args.workload)
    env = make_env(policy, max_episode_steps=args.max_steps, workload=args.workload, profile=args.profile,
                   engine=engine)
    mode_note = "" if args.length_mode else " (the policy reads output lengths)" if policy.uses_output_lengths else ""
    print(f"servegym run: policy={args.policy} workload={args.workload} profile={args.profile} seed={args.seed} "
          f"length mode={engine['length_mode']}{mode_note}")
    result = run_episode(env, policy, seed=args.seed, progress=not args.quiet)
    print(f"{result.steps} steps{' (truncated)' if result.truncated else ''}, "
          f"reward {result.total_reward:.2f}")
    print(format_summary(result.summary))
    print("stability (flow-control paper's conditions for this workload):")
    print(_stability_text(args.workload, args.profile, EngineConfig(**{**engine, **policy.engine_overrides()})))
    if args.out:
        from servegym.evaluation.timeline import plot_timeline

        req, steps = write_csvs(result.log, args.out)
        try:
            timeline = plot_timeline({f"{args.policy} on {args.workload}, seed {args.seed}": result.log},
                                     Path(args.out) / "timeline.png")
        except ImportError:  # matplotlib comes with the eval extra
            print(f"wrote {req} and {steps} (no timeline.png: matplotlib is missing; pip install 'servegym[eval]')")
        else:
            print(f"wrote {req}, {steps} and {timeline}")
    if args.trace:
        from servegym.evaluation.trace import write_trace

        print(f"wrote {write_trace(result.log, args.trace)} (Trace Event Format: open it in ui.perfetto.dev or "
              "chrome://tracing)")
    return 0


def _stability_text(workload: str, profile: str, config: EngineConfig, eps: float = 0.1) -> str:
    report = workload_stability(make_workload(workload), load_profile(profile), config, eps)
    return "\n".join(f"  {line}" for line in report.lines())


def cmd_stability(args: argparse.Namespace) -> int:
    engine = {"length_mode": args.length_mode} if args.length_mode else {}
    args.profile = args.profile or profile_for(args.workload)
    print(f"servegym stability: workload={args.workload} profile={args.profile}")
    print(_stability_text(args.workload, args.profile, EngineConfig(**engine), args.eps))
    return 0


def _with_tuned(experiment, paths):
    """Add each params file's policy, labelled ``<policy>-tuned``, to the experiment."""
    import dataclasses

    from servegym.evaluation import PolicySpec
    from servegym.tuning.study import read_params

    extra = []
    for path in paths:
        name, params = read_params(path)
        make_policy(name, **params)  # validate before running anything
        extra.append(PolicySpec(name, params, f"{name}-tuned"))
    return dataclasses.replace(experiment, policies=(*experiment.policies, *extra))


def cmd_compare(args: argparse.Namespace) -> int:
    from servegym.evaluation import compare, default_experiment, load_experiment

    executor = executor_from_args(args)
    experiment = load_experiment(find_experiment(args.experiment)) if args.experiment else default_experiment()
    if args.seeds is not None:
        experiment = experiment.with_seeds(args.seeds)
    if args.params:
        experiment = _with_tuned(experiment, args.params)
    out = writable_dir(Path(args.out or f"results/{experiment.name}"))
    with FolderLock(out):  # one grid writes a folder at a time
        runs = len(experiment.policies) * len(experiment.workloads) * len(experiment.seeds)
        kept = "" if args.fresh or not (out / "runs").is_dir() else " (finished runs in runs/ are not run again)"
        print(f"servegym compare: {experiment.name}: {len(experiment.policies)} policies x "
              f"{len(experiment.workloads)} workloads x {len(experiment.seeds)} seeds = {runs} runs"
              f"{' as Ray tasks' if executor.kind == 'ray' else ''} -> {out}{kept}")
        _, paths = compare(experiment, out, workers=args.workers, progress=not args.quiet, plots=not args.no_plots,
                           resume=not args.fresh, executor=executor, timeline=args.timeline)
    print(paths["summary"].read_text())
    for name, path in paths.items():
        print(f"wrote {name}: {path}")
    return 0


PAPER_EXPERIMENTS = ("twp_paper_warm", "twp_paper", "flow_control_synthetic", "flow_control_mixed",
                     "flow_control_trace")


def cmd_reproduce(args: argparse.Namespace) -> int:
    from servegym.evaluation import compare, load_experiment
    from servegym.evaluation.reproduction import write_reproduction

    executor = executor_from_args(args)
    results_dir = Path("docs/results") if args.update_docs else Path(args.out) / "results"
    doc = Path("docs/REPRODUCTION.md") if args.update_docs else Path(args.out) / "REPRODUCTION.md"
    if args.from_results:
        results_dir = Path(args.results or results_dir)
    folder = Path(args.experiments) if args.experiments else SHIPPED_EXPERIMENTS
    experiments = {name: load_experiment(folder / f"{name}.yaml") for name in PAPER_EXPERIMENTS}
    if args.seeds is not None:
        experiments = {name: e.with_seeds(args.seeds) for name, e in experiments.items()}
    if not args.from_results:
        too_few = {name: len(e.seeds) for name, e in experiments.items() if len(e.seeds) < MIN_VERDICT_SEEDS}
        if too_few:
            raise ValueError(f"a reproduction verdict needs at least {MIN_VERDICT_SEEDS} seeds per experiment; "
                             f"got {too_few}")
        writable_dir(results_dir)
    writable_dir(doc.parent)
    results, seeds = {}, {}
    with contextlib.nullcontext() if args.from_results else FolderLock(results_dir):
        for name, experiment in experiments.items():
            if args.from_results:
                results[name], seeds[name] = _saved_results(results_dir, name)
                continue
            print(f"servegym reproduce: {name} ({len(experiment.seeds)} seeds) -> {results_dir / name}")
            results[name], _ = compare(experiment, results_dir / name, workers=args.workers,
                                       progress=not args.quiet, executor=executor)
            seeds[name] = len(experiment.seeds)
    claims = write_reproduction(results, seeds, doc)
    for c in claims:
        print(f"[{c.verdict}] {c.paper}: {c.claim}")
    print(f"wrote {doc}" + ("" if args.update_docs else " (pass --update-docs to refresh docs/ instead)"))
    return 0


def _saved_results(results_dir: Path, name: str) -> tuple[list, int]:
    """An experiment's saved runs and their seed count, for ``reproduce --from-results``; clear errors when the
    file is missing or holds too few seeds for a verdict."""
    from servegym.evaluation.report import results_from_tidy_csv

    path = results_dir / name / "results.csv"
    if not path.is_file():
        raise ValueError(f"no saved results for {name}: {path} does not exist (run servegym reproduce first, or "
                         "point --results at a folder holding <experiment>/results.csv, such as docs/results)")
    results = results_from_tidy_csv(path)
    seeds = len({r.seed for r in results})
    if seeds < MIN_VERDICT_SEEDS:
        raise ValueError(f"{path} holds {seeds} seeds; a verdict needs at least {MIN_VERDICT_SEEDS}")
    return results, seeds


def cmd_tune(args: argparse.Namespace) -> int:
    from servegym.tuning import TuneConfig, TuningInterrupted, fresh_seed, tune
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


def cmd_train(args: argparse.Namespace) -> int:
    import json

    from servegym.rl.stopping import TrainingInterrupted
    from servegym.rl.train import resume, train

    try:
        if args.resume:
            print(f"servegym train: resuming {args.resume}")
            run = resume(args.resume, progress=not args.quiet)
        else:
            engine = {"length_mode": args.length_mode or "predicted"}
            engine.update(json_object("--engine", args.engine))
            hyper = json_object("--hyperparams", args.hyperparams)
            fields = {**config_args(args, TRAIN_FLAGS), "mode": args.mode, "env": json_object("--env", args.env),
                      "normalize": not args.no_normalize}
            if args.zoo:
                if not args.task:
                    raise ValueError("--zoo reads the entry of a task: give --task")
                from servegym.rl.zoo import read_zoo

                zoo = read_zoo(args.zoo, args.task)
                fields.update({k: v for k, v in zoo.items() if k != "hyperparams"})
                hyper = {**zoo["hyperparams"], **hyper}
            cfg = TrainConfig(algo=args.algo, task=args.task, workload=args.workload,
                              profile=args.profile, engine=engine, pool=json_object("--pool", args.pool),
                              hyperparams=hyper, **fields, reward_reference=args.reward_reference,
                              imitate=args.imitate, score_base=args.score_base,
                              discount_half_life_s=args.discount_half_life,
                              **({} if args.residual_scale is None else {"residual_scale": args.residual_scale}))
            print(f"servegym train: {cfg.run_name}: {cfg.timesteps} timesteps on {cfg.n_envs} envs")
            run = train(cfg, progress=not args.quiet)
    except TrainingInterrupted as stop:  # SIGINT 130, SIGTERM 143
        print(f"\nservegym train: {stop.message()}", file=sys.stderr)
        return stop.exit_status
    info = json.loads((run / "config.json").read_text())
    best = info["best_mean_reward"]
    print(f"trained in {info['wall_s']:.0f} s; best validation return "
          f"{'n/a' if best is None else f'{best:.1f}'} at {info['best_timesteps']} steps; run: {run}")
    print(f"use it as a policy: servegym run --policy rl:{run}   or in servegym bench --rl {run}")
    return 0


def cmd_scenarios(args: argparse.Namespace) -> int:
    from servegym.evaluation.headroom import SCENARIOS, markdown, measure

    rows = []
    for name in args.only or SCENARIOS:
        print(f"servegym scenarios: {name} ({args.seeds} seeds)", flush=True)
        rows.append(measure(name, args.seeds, args.workers, progress=not args.quiet))
    text = markdown(rows, args.seeds)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


def cmd_flow_regime(args: argparse.Namespace) -> int:
    from servegym.evaluation.regime import cells, markdown, sweep

    print(f"servegym flow-regime: {len(cells())} cells, {args.seeds} seeds", flush=True)
    text = markdown(sweep(args.seeds, args.workers, progress=not args.quiet), args.seeds)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    if args.markdown:
        print(policies_table())
        return 0
    width = max(len(name) for name in POLICIES)
    for name, cls in sorted(POLICIES.items()):
        print(f"{name:<{width}}  {cls.rule}  [{cls.source}]")
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    width = max(len(name) for name in WORKLOADS)
    profile_width = max(len(profile_for(name)) for name in WORKLOADS)
    for name, (_, description) in WORKLOADS.items():
        print(f"{name:<{width}}  {profile_for(name):<{profile_width}}  {description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servegym", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one episode of a policy and print its metrics")
    run.add_argument("--policy", default="fcfs", help=f"one of {sorted(POLICIES)}, or rl:RUN_DIR")
    run.add_argument("--workload", default="medium", choices=sorted(WORKLOADS))
    run.add_argument("--profile", default=None,
                     help=f"shipped profile ({', '.join(shipped_profiles())}) or a JSON path; default: the "
                          "workload's own (servegym workloads)")
    run.add_argument("--seed", type=non_negative_int, default=0)
    run.add_argument("--length-mode", choices=LENGTH_MODES, default=None)
    run.add_argument("--max-steps", type=positive_int, default=200_000,
                     help="truncate the episode after this many steps")
    run.add_argument("--out", default=None, help="folder for requests.csv, steps.csv and timeline.png")
    run.add_argument("--trace", default=None, help="write the episode as Trace Event Format JSON (Perfetto)")
    run.add_argument("--params", default=None, help="policy parameters file (servegym tune's best_params.json)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)
    comp = sub.add_parser("compare", help="run policies x workloads x seeds; write results, tables and plots")
    comp.add_argument("experiment", nargs="?", default=None,
                      help="experiment YAML file, or the name of a shipped one "
                           f"({', '.join(shipped_experiments())}); default: the built-in default experiment")
    comp.add_argument("--seeds", type=positive_int, default=None, help="override the number of seeds")
    comp.add_argument("--workers", type=positive_int, default=None,
                      help="runs at once (default: all cores; with --executor ray, all the cluster's)")
    add_executor_args(comp)
    comp.add_argument("--out", default=None, help="output folder (default: results/<experiment name>)")
    comp.add_argument("--no-plots", action="store_true")
    comp.add_argument("--timeline", action="store_true",
                      help="also write timeline.png: each policy's first-seed episode of the focus workload")
    comp.add_argument("--params", nargs="+", default=None,
                      help="params files (servegym tune's best_params.json): each adds '<policy>-tuned'")
    comp.add_argument("--fresh", action="store_true",
                      help="forget the runs kept in <out>/runs (default: resume, running only what is missing)")
    comp.add_argument("--quiet", action="store_true", help="no progress bar")
    comp.set_defaults(func=cmd_compare)
    rep = sub.add_parser("reproduce", help="run the papers' experiments and write reproduce/REPRODUCTION.md "
                         "(docs/ with --update-docs)")
    rep.add_argument("--experiments", default=None,
                     help="folder with the paper experiment files (default: the shipped ones)")
    rep.add_argument("--out", default="reproduce",
                     help="output folder: results/<experiment>/ and REPRODUCTION.md (default: reproduce)")
    rep.add_argument("--update-docs", action="store_true",
                     help="write docs/results/ and docs/REPRODUCTION.md (the tracked copies) instead of --out")
    rep.add_argument("--from-results", action="store_true",
                     help="re-derive the verdicts from saved results.csv files without running anything")
    rep.add_argument("--results", default=None,
                     help="with --from-results: the folder holding <experiment>/results.csv (default: the output's)")
    rep.add_argument("--seeds", type=positive_int, default=None, help="override every experiment's seed count")
    rep.add_argument("--workers", type=positive_int, default=None,
                     help="runs at once (default: all cores; with --executor ray, all the cluster's)")
    add_executor_args(rep)
    rep.add_argument("--quiet", action="store_true")
    rep.set_defaults(func=cmd_reproduce)
    add_real_backend_parsers(sub)
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
    trn = sub.add_parser("train", help="train a stable-baselines3 agent (PPO by default)")
    trn.add_argument("--algo", default="ppo", choices=["ppo", "a2c", "dqn", "sac", "maskable-ppo"])
    trn.add_argument("--mode", default=None, choices=["admit", "window", "count", "rank", "score", "params"],
                     help="action mode (default per algorithm)")
    trn.add_argument("--task", default=None, choices=sorted(TASKS),
                     help="benchmark task (servegym tasks); the options below override its settings")
    trn.add_argument("--workload", default=None, choices=sorted(WORKLOADS),
                     help="workload (default: the task's, else burst)")
    trn.add_argument("--profile", default=None, help="GPU profile (default: the task's or the workload's)")
    trn.add_argument("--engine", default=None, help='engine settings as JSON, e.g. \'{"num_kv_blocks": 500}\'')
    trn.add_argument("--pool", default=None, help='pool settings as JSON, e.g. \'{"num_containers": 4}\'')
    trn.add_argument("--env", default=None,
                     help='other gym.make arguments as JSON, e.g. \'{"decision_steps": true}\'')
    add_config_args(trn, TrainConfig, TRAIN_FLAGS)
    trn.add_argument("--length-mode", choices=["known", "predicted", "unknown"], default=None,
                     help="default: predicted (every task uses predicted lengths)")
    trn.add_argument("--hyperparams", default=None, help='JSON, e.g. \'{"learning_rate": 3e-4, "n_steps": 512}\'')
    trn.add_argument("--no-normalize", action="store_true",
                     help="no VecNormalize (the score mode's network reads raw features on a log scale)")
    trn.add_argument("--zoo", default=None, metavar="FILE",
                     help="hyperparameters in the RL Zoo's format (docs/rl/hyperparams/ppo.yml): the entry for the "
                          "task's id replaces --timesteps, --n-envs, --no-normalize, --mode and --env where it has "
                          "them, and gives the algorithm's arguments (--hyperparams JSON merges on top)")
    trn.add_argument("--reward-reference", default=None, metavar="PARAMS",
                     help="train on rewards relative to this policy's episode on the same seed (a params file)")
    trn.add_argument("--imitate", default=None, metavar="PARAMS",
                     help="score mode: first fit the policy to a tuned scorer (servegym tune's best_params.json)")
    trn.add_argument("--score-base", default=None, metavar="PARAMS",
                     help="score mode: act as a residual on this tuned scorer (action 0 is the scorer); params "
                          "mode: the scorer whose parameters the agent moves")
    trn.add_argument("--residual-scale", type=float, default=None,
                     help="score mode with --score-base: an action of 1 multiplies a score by exp(scale) and moves "
                          "the memory target by 0.6 x scale of the cache (default 0.2)")
    trn.add_argument("--discount-half-life", type=float, default=None, metavar="SECONDS",
                     help="PPO/A2C: discount each step by the simulated seconds it took (half-life), not per step")
    trn.add_argument("--resume", default=None, metavar="RUN", help="continue RUN from its latest checkpoint")
    trn.add_argument("--quiet", action="store_true")
    trn.set_defaults(func=cmd_train)
    stab = sub.add_parser("stability", help="flow-control stability conditions of a workload on a profile")
    stab.add_argument("--workload", default="medium", choices=sorted(WORKLOADS))
    stab.add_argument("--profile", default=None, help="default: the workload's own (servegym workloads)")
    stab.add_argument("--eps", type=float, default=0.1, help="safety margin of the sufficient condition")
    stab.add_argument("--length-mode", choices=["known", "predicted", "unknown"], default=None)
    stab.set_defaults(func=cmd_stability)
    pol = sub.add_parser("policies", help="list the registered policies")
    pol.add_argument("--markdown", action="store_true", help="the table README.md and docs/POLICIES.md carry")
    pol.set_defaults(func=cmd_policies)
    sub.add_parser("workloads", help="list the named workloads").set_defaults(func=cmd_workloads)
    scen = sub.add_parser("scenarios", help="each scenario's headroom: random, FCFS, best policy, clairvoyant greedy")
    scen.add_argument("--seeds", type=int, default=10)
    scen.add_argument("--workers", type=int, default=None)
    scen.add_argument("--only", nargs="+", default=None, choices=sorted(WORKLOADS), help="these scenarios only")
    scen.add_argument("--out", default=None, help="write the Markdown report here (docs/SCENARIOS.md)")
    scen.add_argument("--quiet", action="store_true")
    scen.set_defaults(func=cmd_scenarios)
    reg = sub.add_parser("flow-regime", help="where flow control's throttle pays: load x memory x eviction cost")
    reg.add_argument("--seeds", type=int, default=5)
    reg.add_argument("--workers", type=int, default=None)
    reg.add_argument("--out", default=None, help="write the Markdown report here (docs/FLOW_REGIME.md)")
    reg.add_argument("--quiet", action="store_true")
    reg.set_defaults(func=cmd_flow_regime)
    add_profile_parser(sub)
    add_bench_parser(sub)
    add_tasks_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with InterruptOnTerm():  # SIGTERM stops any command as Ctrl-C does (exit status 143 rather than 130)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the command; a user's error or a stop is one line on stderr and the shell's exit status."""
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly, like other Unix tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Interrupted as stop:
        print(f"\nservegym: {_stopped_by(stop.signum)}; {len(stop.results)} finished runs kept (re-run the same "
              "command to finish)", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt as stop:
        print(f"\nservegym: {_stopped_by(signal_of(stop))}", file=sys.stderr)
        return exit_status(signal_of(stop))
    except JobFailed as err:
        print(f"servegym: error: {err}\n{len(err.results)} finished runs kept", file=sys.stderr)
        return 1
    except (ValueError, OSError) as err:
        print(f"servegym: error: {err}", file=sys.stderr)
        return 2


def _stopped_by(signum: int) -> str:
    return "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"


if __name__ == "__main__":
    raise SystemExit(main())
