"""The benchmark leaderboard: every policy on every task over the frozen test seeds (``servegym bench``).

Evaluation is locked: a test-track episode builds its env from the task alone (``make_env(policy, task=NAME,
apply_overrides=False)``), so the leaderboard measures exactly the problem an agent trains on (the task's
workload, profile, engine and pool, reward, length mode and episode limits) whatever the policy or agent would set
for itself. A policy whose own engine/pool settings change the task's (TWP's chunk size, Sarathi's token budget,
alpha-protection's clear-all, an agent trained with known lengths) also runs with them in the task's
*engine-config* track, labelled ``<label> [engine-config]``; a policy that means nothing without them (the
clairvoyant greedy packer's true lengths, :attr:`Policy.needs_overrides`) runs there only. Results come back one
:class:`BenchRow` per (task, track, policy, seed), in a fixed order whatever the number of worker processes;
:func:`write_leaderboard` writes them as ``leaderboard.csv`` and ``leaderboard.md``
(:mod:`servegym.benchmark.leaderboard`).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, astuple, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servegym.benchmark.board import (
    ENGINE_CONFIG_SUFFIX,
    INTERRUPTED_MARK,
    VALIDATION_SUFFIX,
    is_heuristic,
    unranked_label,
)
from servegym.benchmark.leaderboard import markdown
from servegym.benchmark.oracle import ORACLE, Budget, frozen_bases, plan_episode
from servegym.benchmark.provenance import RECORD, stamp, unranked_reasons
from servegym.engine import EngineConfig
from servegym.envs.tasks import VALIDATION_SEEDS, get_task
from servegym.evaluation.executor import PROCESSES, Executor, RunStore, progress_bar, run_stored
from servegym.policies import POLICIES, make_policy
from servegym.pool import PoolConfig
from servegym.runner import EpisodeResult, env_profile, make_env, run_episode

if TYPE_CHECKING:
    import gymnasium as gym

    from servegym.benchmark.budgets import TrainingBudget
    from servegym.policies import Policy

DEFAULT_POLICIES = ("random", "random:count", "random:window", "random:rank", "random:score", "fcfs", "twp",
                    "flow-control", "sarathi", "mc-sf", "vllm", "lpm", "priority", "clairvoyant-greedy",
                    "router-round-robin", "router-least-loaded", "router-least-kv", "router-power-of-two",
                    "router-prefix-affinity", "router-kv-aware", ORACLE)
"""The default field: the floors a scheduler must beat (random admission, which is the admit mode's uniform
action, a uniformly random action of each other learning action mode, and FCFS), the seed papers' policies with
their default parameters, the strongest baselines, and the clairvoyant greedy packer (true lengths; not a
bound), every router (on routing tasks, where the others do not play), and the oracle
(:mod:`servegym.benchmark.oracle`: a rollout planner over every other contestant of the task, at or above each of
them on every seed)."""


@dataclass(frozen=True)
class Entry:
    """One leaderboard contestant: a label (unique on the board) for a policy with its parameters."""

    label: str
    policy: str
    """A registered policy name, or ``rl:RUN_DIR`` for an agent trained by ``servegym train``."""
    params: dict[str, Any] = field(default_factory=dict)
    tasks: tuple[str, ...] = ()
    """The tasks it runs on (empty: every task): a policy tuned on one task, an agent trained on one."""
    fingerprint: str = ""
    """For a trained agent, its model file's size and time: part of the run store's key, so a retrained agent
    in the same folder is scored again."""

    def runs_on(self, task: str) -> bool:
        return not self.tasks or task in self.tasks


TEST_TRACK, ENGINE_CONFIG_TRACK, VALIDATION_TRACK = "test", "engine-config", "validation"
"""Where an episode runs: ``test``, exactly the task's settings on its test data and seeds (ranked);
``engine-config``, with the policy's own engine settings on top (shown apart); ``validation``, exactly the task's
settings on its *training* data and :data:`~servegym.envs.tasks.VALIDATION_SEEDS` (where the best heuristic is
chosen, so the test seeds never pick what they are compared against)."""


@dataclass(frozen=True)
class BenchJob:
    """One episode of the leaderboard."""

    task: str
    entry: Entry
    seed: int
    track: str = TEST_TRACK
    """:data:`TEST_TRACK`, :data:`ENGINE_CONFIG_TRACK` or :data:`VALIDATION_TRACK`."""
    bases: tuple[Entry, ...] = ()
    """For the oracle: its frozen base policies (:func:`~servegym.benchmark.oracle.frozen_bases`)."""

    @property
    def label(self) -> str:
        suffix = {ENGINE_CONFIG_TRACK: ENGINE_CONFIG_SUFFIX, VALIDATION_TRACK: VALIDATION_SUFFIX}.get(self.track, "")
        return self.entry.label + suffix


@dataclass(frozen=True)
class BenchRow:
    """One episode's scores; the fields, in order, are the columns of ``leaderboard.csv``."""

    task: str
    policy: str
    """The entry's label."""
    seed: int
    episode_return: float
    """The undiscounted sum of the task's rewards (reward units: minus request-seconds, or SLO-good requests)."""
    goodput_rps: float
    e2e_mean_all_s: float
    """Mean end-to-end latency over every arrived, unrejected request, the unfinished counted to the end."""
    ttft_p99_s: float
    unfinished: int
    truncated: bool
    steps: int
    prefix_hit_ratio: float = math.nan
    """Prompt tokens found cached over prompt tokens admitted (0 without prefix caching; NaN in files written
    before the column)."""


COLUMNS = tuple(f.name for f in fields(BenchRow))
OLD_COLUMNS = COLUMNS[:-1]
"""The columns of a ``leaderboard.csv`` written before the prefix hit ratio (it reads as NaN)."""


def make_entries(policies: Sequence[str] = DEFAULT_POLICIES, params_files: Sequence[str | Path] = (),
                 rl_runs: Sequence[str | Path] = (), tuned_dir: str | Path | None = None,
                 tasks: Sequence[str] = ()) -> list[Entry]:
    """The contestants: ``policies`` with default parameters (labelled by name), a ``<policy> (tuned)`` entry per
    params file (``servegym tune``'s ``best_params.json``, on every task), per ``tuned_dir/<policy>-<task>/
    best_params.json`` found for one of ``tasks`` (on that task only), and an ``rl:<run name>`` entry per trained
    run (on the task it trained on, or on every task when it trained on none).

    A run whose training did not finish is labelled ``<label> [interrupted]`` (its ``config.json`` says so), never
    shown as a finished agent. A params file or run whose data record (:mod:`servegym.benchmark.provenance`) shows
    test data, another env version or no record at all is labelled ``<label> [unranked: why]``: the board shows it
    apart and never ranks it, counts it in the headroom, chooses it as the best heuristic or plans the oracle over
    it.

    Every entry is checked here, before anything runs: unknown policies, unreadable params files, parameters a
    policy rejects, run folders without a ``config.json`` and labels that repeat on a task are errors.
    """
    from servegym.rl.runs import unfinished
    from servegym.tuning.study import params_record, read_params

    entries = [Entry(name, name, asdict(Budget()) if name == ORACLE else {}) for name in policies]
    for path in params_files:
        name, params = read_params(path)
        entries.append(Entry(unranked_label(f"{name} (tuned)", unranked_reasons(params_record(path))), name, params))
    if tuned_dir is not None:
        if not Path(tuned_dir).is_dir():
            raise ValueError(f"--tuned {tuned_dir}: no such folder")
        before = len(entries)
        for task in tasks:
            for path in sorted(Path(tuned_dir).glob(f"*-{task}/best_params.json")):
                name, params = read_params(path)
                if path.parent.name == f"{name}-{task}":
                    label = unranked_label(f"{name} (tuned)", unranked_reasons(params_record(path)))
                    entries.append(Entry(label, name, params, (task,)))
        if len(entries) == before:
            raise ValueError(f"--tuned {tuned_dir}: no <policy>-<task>/best_params.json for tasks {list(tasks)}")
    for run in rl_runs:
        config = Path(run) / "config.json"
        record = json.loads(config.read_text()) if config.is_file() else {}
        trained_on = record.get("task")
        label = unranked_label(f"rl:{Path(run).name}", unranked_reasons(record.get(RECORD)) if record else [])
        label += INTERRUPTED_MARK if record and unfinished(run) else ""
        entries.append(Entry(label, f"rl:{run}", {}, (trained_on,) if trained_on else (), _fingerprint(Path(run))))
    for entry in entries:
        check_entry(entry)
    for task in tasks or [None]:
        seen: dict[str, Entry] = {}
        for entry in entries:
            if task is not None and not entry.runs_on(task):
                continue
            if entry.label in seen:
                raise ValueError(f"duplicate leaderboard label {entry.label!r} ({seen[entry.label].policy} and "
                                 f"{entry.policy}){f' on {task}' if task else ''}; every policy, params file and "
                                 "run may appear once per task")
            seen[entry.label] = entry
    return entries


def _fingerprint(run: Path) -> str:
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run.glob("*.zip"))]
    return repr(stats)


def check_entry(entry: Entry) -> None:
    """Raise ``ValueError`` when ``entry`` cannot be built (without loading a trained agent's weights)."""
    if entry.policy.startswith("rl:"):
        run = Path(entry.policy.removeprefix("rl:"))
        if not (run / "config.json").is_file():
            raise ValueError(f"{run} is not a servegym train run (no config.json)")
        return
    if entry.policy == ORACLE:
        try:
            Budget(**entry.params)
        except TypeError as err:
            raise ValueError(f"oracle: {err}") from None
        return
    if entry.policy not in POLICIES and not entry.policy.startswith("random:"):
        raise ValueError(f"unknown policy {entry.policy!r}; registered: {sorted(POLICIES)}, rl:RUN_DIR or "
                         "random:MODE")
    try:
        make_policy(entry.policy, **entry.params)
    except TypeError as err:  # a parameter the policy does not have
        raise ValueError(f"policy {entry.label!r}: {err}") from None


def own_settings(entry: Entry) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """The entry's own engine and pool settings and whether it needs them (an agent's: its training length mode,
    read from its run's ``config.json`` without loading the model)."""
    if entry.policy == ORACLE:
        return {}, {}, False
    if entry.policy.startswith("rl:"):
        config = json.loads((Path(entry.policy.removeprefix("rl:")) / "config.json").read_text())
        mode = config.get("engine", {}).get("length_mode")
        return ({"length_mode": mode} if mode else {}), {}, False
    policy = make_policy(entry.policy, **entry.params)
    if policy.decision == "route":  # its router is what it decides, on every track, not a setting
        return policy.engine_overrides(), {}, type(policy).needs_overrides
    return policy.engine_overrides(), policy.pool_overrides(), type(policy).needs_overrides


def entry_decision(entry: Entry) -> str | None:
    """What the entry decides (``"admission"`` or ``"route"``; an agent's, from its run's action mode); None for
    the oracle, which plays whatever its bases decide."""
    if entry.policy == ORACLE:
        return None
    if entry.policy.startswith("rl:"):
        config = json.loads((Path(entry.policy.removeprefix("rl:")) / "config.json").read_text())
        return "route" if config.get("mode") == "route" else "admission"
    if entry.policy.startswith("random:"):
        return "admission"
    return POLICIES[entry.policy].decision if entry.policy in POLICIES else "admission"


def changed_settings(task: str, engine: dict[str, Any], pool: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``engine``/``pool`` that differ from ``task``'s (any component's, for a mixture)."""
    spec = get_task(task)
    changed: dict[str, Any] = {}
    for name in spec.components or (spec.name,):
        own = get_task(name)
        for config, base, extra in ((EngineConfig, own.engine, engine), (PoolConfig, own.pool, pool)):
            before, after = config(**base), config(**{**base, **extra})
            changed.update({k: getattr(after, k) for k in extra if getattr(before, k) != getattr(after, k)})
    return changed


def tracks(task: str, entry: Entry, settings: tuple[dict[str, Any], dict[str, Any], bool]) -> tuple[str, ...]:
    """Where ``entry`` runs on ``task``: the test track unless it needs settings the task does not have, and the
    engine-config track when its own settings change the task's."""
    engine, pool, needs = settings
    if not changed_settings(task, engine, pool):
        return (TEST_TRACK,)
    return (ENGINE_CONFIG_TRACK,) if needs else (TEST_TRACK, ENGINE_CONFIG_TRACK)


def task_test_seeds(task: str, max_seeds: int | None = None) -> tuple[int, ...]:
    """The seeds ``task`` is tested on (:attr:`~servegym.envs.tasks.Task.test_seeds`: as many as it has independent
    test episodes), the first ``max_seeds`` of them when given."""
    seeds = get_task(task).test_seeds
    return seeds if max_seeds is None else seeds[:max_seeds]


def make_jobs(tasks: Sequence[str], entries: Sequence[Entry], seeds: Iterable[int] | None = None,
              validation: Sequence[int] = VALIDATION_SEEDS, max_seeds: int | None = None) -> list[BenchJob]:
    """Every (task, entry, track, seed), task-major: each entry's test (and engine-config) episodes on the task's
    test seeds (:func:`task_test_seeds`; ``seeds`` replaces them on every task), then every ranked heuristic's
    validation episodes on ``validation`` (where the best heuristic is chosen); the oracle's jobs carry its frozen
    bases. Unknown tasks and an empty seed list are errors."""
    for name in tasks:
        get_task(name)
    fixed = None if seeds is None else tuple(seeds)
    if fixed is not None and not fixed:
        raise ValueError("no seeds to run")
    settings = {entry.label: own_settings(entry) for entry in entries}
    jobs = []
    for task in tasks:
        decision = get_task(task).decision
        runs = [(entry, track) for entry in entries
                if entry.runs_on(task) and entry_decision(entry) in (None, decision)
                for track in tracks(task, entry, settings[entry.label])]
        bases = tuple(Entry(label, policy, params) for label, policy, params in frozen_bases(task, decision))
        seeds = fixed if fixed is not None else task_test_seeds(task, max_seeds)
        for entry, track in runs:
            jobs += [BenchJob(task, entry, seed, track, bases if entry.policy == ORACLE else ()) for seed in seeds]
        jobs += [BenchJob(task, entry, seed, VALIDATION_TRACK) for entry, track in runs
                 if track == TEST_TRACK and is_heuristic(entry.label) for seed in validation]
    return jobs


def play(job: BenchJob) -> EpisodeResult:
    """Run one leaderboard episode: the task's env (with the policy's own settings on top only in the
    engine-config track), the entry's policy, the job's seed."""
    if job.entry.policy == ORACLE:
        return play_oracle(job)
    policy = make_policy(job.entry.policy, **job.entry.params)
    split = "train" if job.track == VALIDATION_TRACK else "test"
    env = make_env(policy, task=job.task, split=split, apply_overrides=job.track == ENGINE_CONFIG_TRACK)
    try:
        return run_episode(env, policy, seed=job.seed)
    finally:
        env.close()


def play_oracle(job: BenchJob) -> EpisodeResult:
    """The oracle's episode: the task's test-track env, planned over the job's (frozen) bases."""
    env = make_env(task=job.task, split="test", apply_overrides=False)
    try:
        return plan_episode(env, oracle_bases(job, env), job.seed, Budget(**job.entry.params)).result
    finally:
        env.close()


def oracle_bases(job: BenchJob, env: gym.Env) -> dict[str, Policy]:
    """The oracle's (frozen) base policies of ``job``, by label, each bound to ``env``'s profile."""
    bases = {}
    for entry in job.bases:
        policy = make_policy(entry.policy, **entry.params)
        policy.bind_profile(env_profile(env))
        bases[entry.label] = policy
    return bases


def bench_row(job: BenchJob, result: EpisodeResult) -> BenchRow:
    summary = result.summary
    return BenchRow(job.task, job.label, job.seed, float(result.total_reward), summary["goodput_rps"],
                    summary["e2e_mean_all_s"], summary["ttft_p99"], int(summary["num_unfinished"]),
                    bool(result.truncated), int(result.steps), summary["prefix_hit_ratio"])


def run_job(job: BenchJob) -> BenchRow:
    return bench_row(job, play(job))


def run_bench(tasks: Sequence[str], entries: Sequence[Entry], seeds: Iterable[int] | None = None,
              workers: int | None = None, progress: bool = False, store: RunStore | None = None,
              executor: Executor = PROCESSES, validation: Sequence[int] = VALIDATION_SEEDS,
              max_seeds: int | None = None) -> list[BenchRow]:
    """Run every (task, entry, seed) episode and the heuristics' ``validation`` episodes (:func:`make_jobs`), in
    ``workers`` processes (default: all cores), or as Ray tasks with a Ray ``executor``.

    Rows come back in (task, entry, seed) order whatever the worker count, and each episode depends only on its
    job, so the rows are identical for any ``workers``. With a ``store``, episodes already in it are not run
    again and each new one is saved as it finishes; Ctrl-C raises
    :class:`~servegym.evaluation.executor.Interrupted` with the finished rows.
    """
    todo = make_jobs(tasks, entries, seeds, validation, max_seeds)
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return run_stored(run_job, todo, workers, store, _describe, _bar(len(todo)) if progress else None,
                      executor)


def _describe(job: BenchJob) -> str:
    return f"episode of {job.label} on {job.task} seed {job.seed}"


def write_leaderboard(rows: Sequence[BenchRow], out_dir: str | Path, command: str = "servegym bench",
                      partial: tuple[int, int] | None = None, budgets: Sequence[TrainingBudget] = ()
                      ) -> tuple[Path, Path]:
    """Write ``leaderboard.csv`` (one row per episode, :data:`COLUMNS`) and ``leaderboard.md`` (per task, the
    policies best-first with 95% confidence intervals, and the task's headroom; ``budgets``, the trained agents'
    :class:`~servegym.benchmark.budgets.TrainingBudget`, as a table at the end); return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "leaderboard.csv", out / "leaderboard.md"
    tmp = csv_path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(astuple(row) for row in rows)
    os.replace(tmp, csv_path)
    text = markdown(rows, command, built_by=stamp())
    if budgets:
        from servegym.benchmark.budgets import budget_lines

        text += "\n" + "\n".join(budget_lines(budgets))
    if partial is not None:
        text = (f"> **PARTIAL RESULTS**: stopped after {partial[0]} of {partial[1]} episodes; re-run the same "
                "command to finish (finished episodes are kept in `runs/`).\n\n" + text)
    tmp = md_path.with_suffix(".md.tmp")
    tmp.write_text(text)
    os.replace(tmp, md_path)
    return csv_path, md_path


def read_leaderboard(path: str | Path) -> list[BenchRow]:
    """The rows of a ``leaderboard.csv``."""
    types = {f.name: f.type for f in fields(BenchRow)}
    convert = {"int": int, "float": float, "str": str, "bool": lambda text: text == "True"}
    with Path(path).open(newline="") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) not in (COLUMNS, OLD_COLUMNS):
            raise ValueError(f"{path}: columns {reader.fieldnames} are not a leaderboard's {list(COLUMNS)}")
        return [BenchRow(**{k: convert[types[k]](v) for k, v in row.items()}) for row in reader]


def headroom_lines(path: str | Path) -> dict[str, str]:
    """Task -> its headroom sentence, from a ``leaderboard.csv``."""
    from servegym.benchmark.board import boards
    from servegym.benchmark.leaderboard import headroom_line

    return {board.task: headroom_line(board) for board in boards(read_leaderboard(path))}


def _bar(total: int) -> Any:
    return progress_bar(total, "bench", "episode")
