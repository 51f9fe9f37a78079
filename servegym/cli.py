"""The ``servegym`` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from servegym.backends import load_profile, shipped_profiles
from servegym.cli_args import (
    add_executor_args,
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
from servegym.cli_train import add_train_parser
from servegym.cli_tune import add_tune_parser
from servegym.engine import EngineConfig
from servegym.engine.config import LENGTH_MODES
from servegym.envs.tasks import SPLITS, TASKS
from servegym.evaluation.executor import (
    FolderLock,
    Interrupted,
    InterruptOnTerm,
    JobFailed,
    RunStore,
    exit_status,
    signal_of,
)
from servegym.evaluation.stats import MIN_VERDICT_SEEDS
from servegym.experiments import FOLDER as SHIPPED_EXPERIMENTS
from servegym.experiments import find_experiment, shipped_experiments
from servegym.metrics import metric
from servegym.policies import POLICIES, make_policy, policies_table
from servegym.runner import make_env, run_episode, write_csvs, write_summary
from servegym.stability import workload_stability
from servegym.validation import count_arg
from servegym.workloads import WORKLOADS, make_workload
from servegym.workloads.scenarios import profile_for

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
    task = _run_task(args, params)
    policy = make_policy(args.policy, **params)
    given = json_object("--engine", args.engine)
    if args.length_mode and given.get("length_mode", args.length_mode) != args.length_mode:
        raise ValueError(f"--length-mode {args.length_mode} and --engine's length_mode "
                         f"{given['length_mode']!r} disagree")
    pool = json_object("--pool", args.pool)
    if task is None:
        mode = args.length_mode or ("predicted" if policy.uses_output_lengths else EngineConfig().length_mode.value)
        mode = policy.engine_overrides().get("length_mode", mode)  # a policy's own setting wins (an rl: agent's)
        engine = {"length_mode": mode, **given}
        args.workload = args.workload or "medium"
        args.profile = args.profile or profile_for(args.workload)
        env = make_env(policy, max_episode_steps=args.max_steps, workload=args.workload, profile=args.profile,
                       engine=engine, pool=pool)
        mode_note = "" if args.length_mode else " (the policy reads output lengths)" if policy.uses_output_lengths \
            else ""
        where = f"workload={args.workload} profile={args.profile}"
    else:  # the task's settings, with the options given on top
        engine = {**({"length_mode": args.length_mode} if args.length_mode else {}), **given}
        chosen = {key: value for key, value in (("workload", args.workload), ("profile", args.profile)) if value}
        env = make_env(policy, max_episode_steps=args.max_steps, task=task.name, split=args.split, engine=engine,
                       pool=pool, **chosen)
        if not task.is_mixture:
            args.workload = args.workload or task.workload_for(args.split)
            args.profile = args.profile or task.profile or profile_for(args.workload)
            engine = {**task.engine, **engine}
        mode_note = ""
        where = f"task={task.name} ({args.split} split)" + (f" workload={args.workload} profile={args.profile}"
                                                            if not task.is_mixture else "")
    shown_mode = engine.get("length_mode", "each component's" if task else EngineConfig().length_mode.value)
    print(f"servegym run: policy={args.policy} {where} seed={args.seed} length mode={shown_mode}{mode_note}")
    if args.counterfactual_k is not None:
        import copy

        replay = copy.deepcopy((env, policy))  # before the episode: the same env and policy, fresh
    result = run_episode(env, policy, seed=args.seed, progress=not args.quiet)
    print(f"{result.steps} steps{' (truncated)' if result.truncated else ''}, "
          f"reward {result.total_reward:.2f}")
    print(format_summary(result.summary))
    if task is None or not (task.is_mixture or task.decision == "route"):
        # A mixture has no one workload; a routing task's cluster is not the one engine the conditions are for.
        print("stability (flow-control paper's conditions for this workload):")
        print(_stability_text(args.workload, args.profile, EngineConfig(**{**engine, **policy.engine_overrides()})))
    decisions = _counterfactual(args, *replay, result.total_reward) if args.counterfactual_k is not None else None
    if args.out:
        from servegym.evaluation.timeline import plot_timeline

        req, steps = write_csvs(result.log, args.out)
        write_summary(result, args.out, {
            "policy": args.policy, "params": params, "workload": args.workload, "profile": args.profile,
            "seed": args.seed, "max_steps": args.max_steps, "engine": engine, "pool": pool,
            "engine_overrides": policy.engine_overrides(), "pool_overrides": policy.pool_overrides(),
            **({"task": task.name, "split": args.split} if task else {}),
            **({"counterfactual_k": args.counterfactual_k} if decisions is not None else {})})
        written = f"{req}, {steps}, summary.json, run.json"
        if decisions is not None:
            from servegym.evaluation.counterfactual import write_counterfactual

            path = write_counterfactual(decisions, Path(args.out) / "counterfactual.csv",
                                        env.unwrapped.num_replicas)
            written += f", {path.name}"
        try:
            label = f"{args.policy} on {task.name if task else args.workload}, seed {args.seed}"
            timeline = plot_timeline({label: result.log}, Path(args.out) / "timeline.png")
        except ImportError:  # matplotlib comes with the eval extra
            print(f"wrote {written} (no timeline.png: matplotlib is missing; pip install 'servegym[eval]')")
        else:
            print(f"wrote {written} and {timeline}")
    if args.trace:
        from servegym.evaluation.trace import write_trace

        print(f"wrote {write_trace(result.log, args.trace)} (Trace Event Format: open it in ui.perfetto.dev or "
              "chrome://tracing)")
    return 0


def _run_task(args: argparse.Namespace, params: dict):
    """The benchmark task ``servegym run`` plays (None: a plain serving env), checked against the policy and
    ``--counterfactual-k`` before anything runs: a router plays a routing task, every other policy an
    admission one, and counterfactual regret replays routing decisions."""
    from servegym.benchmark.bench import Entry, entry_decision
    from servegym.envs.tasks import TASKS, get_task

    task = get_task(args.task) if args.task else None
    if args.split is not None and task is None:
        raise ValueError(f"--split {args.split} picks a task's data: give --task")
    args.split = args.split or "test"
    if args.policy not in POLICIES and not args.policy.startswith("rl:"):
        return task  # make_policy names the registered ones
    decision = entry_decision(Entry(args.policy, args.policy, params))
    routing = sorted(name for name, t in TASKS.items() if t.decision == "route")
    wanted = task.decision if task is not None else "admission"
    if decision != wanted:
        if decision == "route":
            raise ValueError(f"{args.policy} routes arrivals among replicas: run it on a routing task "
                             f"(--task {' or '.join(routing)})")
        raise ValueError(f"task {task.name} decides routes; {args.policy} decides admissions (run a router: "
                         "servegym policies lists the router-* ones)")
    if args.counterfactual_k is not None and (task is None or task.decision != "route"):
        given = f"task {task.name}, which decides admissions" if task is not None else "a run without --task"
        raise ValueError(f"--counterfactual-k replays routing decisions: it needs a routing task (--task "
                         f"{' or '.join(routing)}), not {given}")
    return task


def _counterfactual(args: argparse.Namespace, env, policy, episode_return: float) -> list:
    """Every replica's return at the first ``--counterfactual-k`` routing decisions of the run's episode
    (replayed on ``env``/``policy``, fresh copies of the run's), with a line on the regret."""
    from servegym.evaluation.counterfactual import counterfactual_regret

    print(f"counterfactual: every replica at the first {args.counterfactual_k} routing decisions", flush=True)
    decisions = counterfactual_regret(env, policy, args.seed, args.counterfactual_k)
    if decisions and decisions[0].returns[decisions[0].chosen] != episode_return:
        raise RuntimeError(f"the replayed episode returned {decisions[0].returns[decisions[0].chosen]!r}, the run "
                           f"{episode_return!r}: the env is not deterministic under copy")
    regrets = [d.regret for d in decisions]
    worse = sum(r > 0 for r in regrets)
    print(f"  {len(decisions)} decisions: {worse} with a better replica, mean regret "
          f"{sum(regrets) / max(len(regrets), 1):.3f}, max {max(regrets, default=0.0):.3f} (reward units)")
    return decisions


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


PAPER_EXPERIMENTS = ("twp_paper_warm", "twp_paper", "twp_memory_bound", "flow_control_synthetic",
                     "flow_control_synthetic_80", "flow_control_mixed", "flow_control_chat")


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
    claims = write_reproduction(results, seeds, doc, {name: e.regime for name, e in experiments.items()})
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


@contextlib.contextmanager
def _kept_runs(args: argparse.Namespace, command: str) -> Iterator[RunStore]:
    """The run store of a command that keeps its finished runs (``--runs``, locked for the command's length),
    with the report file's folder (``--out``) checked before any run starts."""
    if args.out:
        writable_dir(Path(args.out).resolve().parent)
    folder = writable_dir(Path(args.runs))
    with FolderLock(folder):
        store = RunStore(folder / "runs")
        if args.fresh:
            store.clear()
        held = len(store)
        print(f"servegym {command}: finished runs are kept in {folder / 'runs'}"
              + (f" ({held} from before are not run again)" if held else ""), flush=True)
        try:
            yield store
        except Interrupted as stop:
            stop.kept = len(store)  # this grid's and the earlier grids' of the same command
            raise


def _write_report(text: str, out: str | None) -> None:
    print(text)
    if out:
        path = Path(out)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        print(f"wrote {out}")


def cmd_scenarios(args: argparse.Namespace) -> int:
    from servegym.benchmark.headroom import SCENARIOS, markdown, measure

    rows = []
    with _kept_runs(args, "scenarios") as store:
        for name in args.only or SCENARIOS:
            print(f"servegym scenarios: {name} ({args.seeds} seeds)", flush=True)
            rows.append(measure(name, args.seeds, args.workers, progress=not args.quiet, store=store))
    _write_report(markdown(rows, args.seeds), args.out)
    return 0


def cmd_flow_regime(args: argparse.Namespace) -> int:
    from servegym.evaluation.regime import cells, markdown, sweep

    with _kept_runs(args, "flow-regime") as store:
        print(f"servegym flow-regime: {len(cells())} cells, {args.seeds} seeds", flush=True)
        rows = sweep(args.seeds, args.workers, progress=not args.quiet, store=store)
    _write_report(markdown(rows, args.seeds), args.out)
    return 0


def _add_kept_runs_args(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("--runs", default=f"results/{command}",
                        help="folder that keeps each finished run, so that a stopped command re-run the same way runs "
                             f"only what is missing (default: results/{command})")
    parser.add_argument("--fresh", action="store_true", help="forget the runs kept in --runs and run everything")


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
    run.add_argument("--task", default=None, choices=sorted(TASKS),
                     help="play a benchmark task's env (servegym tasks): its workload, profile, engine, pool and "
                          "reward, the options below on top; a routing task (cluster-routing) takes a router "
                          "policy (router-*)")
    run.add_argument("--split", default=None, choices=SPLITS,
                     help="with --task: its training or held-out test data (default: test)")
    run.add_argument("--workload", default=None, choices=sorted(WORKLOADS),
                     help="default: the task's, else medium")
    run.add_argument("--profile", default=None,
                     help=f"shipped profile ({', '.join(shipped_profiles())}) or a JSON path; default: the "
                          "task's, else the workload's own (servegym workloads)")
    run.add_argument("--seed", type=non_negative_int, default=0)
    run.add_argument("--length-mode", choices=LENGTH_MODES, default=None)
    run.add_argument("--max-steps", type=positive_int, default=200_000,
                     help="truncate the episode after this many steps")
    run.add_argument("--engine", default=None,
                     help='engine settings as JSON, e.g. \'{"prefix_caching": true}\' (the policy\'s own win)')
    run.add_argument("--pool", default=None, help='pool settings as JSON, e.g. \'{"num_containers": 4}\'')
    run.add_argument("--out", default=None,
                     help="folder for requests.csv, steps.csv, summary.json, run.json and timeline.png")
    run.add_argument("--trace", default=None, help="write the episode as Trace Event Format JSON (Perfetto)")
    run.add_argument("--params", default=None, help="policy parameters file (servegym tune's best_params.json)")
    run.add_argument("--counterfactual-k", type=positive_int, default=None, metavar="K",
                     help="on a routing task: at each of the first K routing decisions, roll every replica out on "
                          "a copy of the env (the policy finishing the episode) and write counterfactual.csv (each "
                          "replica's return, the best, the regret) beside summary.json in --out")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)
    comp = sub.add_parser("compare", help="run policies x workloads x seeds; write results, tables and plots")
    comp.add_argument("experiment", nargs="?", default=None,
                      help="experiment YAML file, or the name of a shipped one "
                           f"({', '.join(shipped_experiments())}); default: the built-in default experiment")
    comp.add_argument("--seeds", type=count_arg("seeds"), default=None, help="override the number of seeds")
    comp.add_argument("--workers", type=count_arg("workers"), default=None,
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
    rep.add_argument("--seeds", type=count_arg("seeds"), default=None, help="override every experiment's seed count")
    rep.add_argument("--workers", type=count_arg("workers"), default=None,
                     help="runs at once (default: all cores; with --executor ray, all the cluster's)")
    add_executor_args(rep)
    rep.add_argument("--quiet", action="store_true")
    rep.set_defaults(func=cmd_reproduce)
    add_real_backend_parsers(sub)
    add_tune_parser(sub)
    add_train_parser(sub)
    stab = sub.add_parser("stability", help="flow-control stability conditions of a workload on a profile")
    stab.add_argument("--workload", default="medium", choices=sorted(WORKLOADS))
    stab.add_argument("--profile", default=None, help="default: the workload's own (servegym workloads)")
    stab.add_argument("--eps", type=float, default=0.1, help="safety margin of the sufficient condition")
    stab.add_argument("--length-mode", choices=LENGTH_MODES, default=None)
    stab.set_defaults(func=cmd_stability)
    pol = sub.add_parser("policies", help="list the registered policies")
    pol.add_argument("--markdown", action="store_true", help="the table README.md and docs/POLICIES.md carry")
    pol.set_defaults(func=cmd_policies)
    sub.add_parser("workloads", help="list the named workloads").set_defaults(func=cmd_workloads)
    scen = sub.add_parser("scenarios", help="each scenario's headroom: random, FCFS, best policy, clairvoyant greedy")
    scen.add_argument("--seeds", type=count_arg("seeds"), default=10)
    scen.add_argument("--workers", type=count_arg("workers"), default=None)
    scen.add_argument("--only", nargs="+", default=None, choices=sorted(WORKLOADS), help="these scenarios only")
    scen.add_argument("--out", default=None, help="write the Markdown report here (docs/SCENARIOS.md)")
    _add_kept_runs_args(scen, "scenarios")
    scen.add_argument("--quiet", action="store_true")
    scen.set_defaults(func=cmd_scenarios)
    reg = sub.add_parser("flow-regime", help="where flow control's throttle pays: load x memory x eviction cost")
    reg.add_argument("--seeds", type=count_arg("seeds"), default=5)
    reg.add_argument("--workers", type=count_arg("workers"), default=None)
    reg.add_argument("--out", default=None, help="write the Markdown report here (docs/FLOW_REGIME.md)")
    _add_kept_runs_args(reg, "flow-regime")
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
        kept = len(stop.results) if stop.kept is None else stop.kept
        print(f"\nservegym: {_stopped_by(stop.signum)}; {kept} finished runs kept (re-run the same command to "
              "finish)", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt as stop:
        print(f"\nservegym: {_stopped_by(signal_of(stop))}", file=sys.stderr)
        return exit_status(signal_of(stop))
    except JobFailed as err:
        print(f"servegym: error: {err}\n{len(err.results)} finished runs kept", file=sys.stderr)
        return 1
    except (ValueError, OSError) as err:
        print(f"servegym: error: {error_text(err)}", file=sys.stderr)
        return 2


def error_text(err: BaseException) -> str:
    """One line for a user's error: an OS error as ``path: reason`` (``[Errno 20] Not a directory: 'x'`` reads
    ``x: not a directory``), anything else as its message with its line breaks folded."""
    if isinstance(err, OSError) and err.strerror:
        where = ": ".join(str(name) for name in (err.filename, err.filename2) if name is not None)
        reason = err.strerror[0].lower() + err.strerror[1:]
        return f"{where}: {reason}" if where else reason
    return " ".join(str(err).split())


def _stopped_by(signum: int) -> str:
    return "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"


if __name__ == "__main__":
    raise SystemExit(main())
