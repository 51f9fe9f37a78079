"""Run every (policy, workload, seed) of an experiment, in parallel worker processes."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from servegym.backends import load_profile
from servegym.engine import STEP_INDEX, EngineConfig
from servegym.envs.tasks import get_task
from servegym.evaluation.executor import PROCESSES, Executor, RunStore, progress_bar, run_stored
from servegym.evaluation.spec import Experiment, PolicySpec, WorkloadSpec, check_workload
from servegym.metrics import inter_token_latencies, summarize
from servegym.policies import Policy, make_policy
from servegym.runner import EpisodeResult, make_env, run_episode
from servegym.workloads.scenarios import profile_for

ITL_SAMPLE = 4000
"""Inter-token gaps kept per run for distribution plots (a seeded subsample)."""


@dataclass(frozen=True)
class Task:
    policy: PolicySpec
    workload: WorkloadSpec
    seed: int
    profile: str
    engine: dict[str, Any]
    pool: dict[str, Any]
    max_steps: int
    ttft_slo_s: float
    itl_slo_s: float
    task: str | None = None
    """The benchmark task whose env the run plays (the experiment's); None: the plain serving env."""
    split: str = "test"

    def __repr__(self) -> str:
        """The run store's key (``repr``, as the dataclass writes it); a run without a task leaves its task and
        split out, so it keeps the key it had before experiments took a task (its stored result is reused)."""
        names = [f.name for f in fields(self) if self.task is not None or f.name not in ("task", "split")]
        return f"{type(self).__qualname__}({', '.join(f'{name}={getattr(self, name)!r}' for name in names)})"


@dataclass
class TaskResult:
    policy: str
    workload: str
    seed: int
    metrics: dict[str, float]
    ttft_by_request: np.ndarray
    itl_sample: np.ndarray
    series: dict[str, np.ndarray] = field(default_factory=dict)
    """For TWP: per-step window, batch, queue and KV use (the feedback loop)."""


def tasks(experiment: Experiment) -> list[Task]:
    own = get_task(experiment.task).profile if experiment.task is not None else None
    return [
        Task(policy, workload, seed, experiment.profile or own or profile_for(workload.source), experiment.engine,
             experiment.pool, experiment.max_steps,
             experiment.ttft_slo_s, experiment.itl_slo_s, experiment.task, experiment.split)
        for workload in experiment.workloads for policy in experiment.policies for seed in experiment.seeds
    ]


def _params(task: Task) -> dict[str, Any]:
    """The run's policy parameters: the policy's own, overridden by the workload's ``policy_params``."""
    return {**task.policy.params, **task.workload.policy_params.get(task.policy.name, {})}


def _engine(task: Task) -> dict[str, Any]:
    """The run's engine settings: the experiment's, with the workload's length mode."""
    engine = dict(task.engine)
    if task.workload.length_mode is not None:
        engine["length_mode"] = task.workload.length_mode
    return engine


def check_inputs(experiment: Experiment, todo: list[Task]) -> None:
    """Load and validate, once and in this process, every input the runs read: each profile, each workload
    (traces are read and checked here), each policy with its per-workload parameters and each engine setting.

    A bad input then stops the grid before its first run with one line naming the experiment and the input,
    instead of failing every run inside the workers.
    """
    def fail(what: str, err: Exception) -> ValueError:
        return ValueError(f"experiment {experiment.name}: {what}: {' '.join(str(err).split())}")

    for profile in sorted({task.profile for task in todo}):
        try:
            load_profile(profile)
        except (ValueError, OSError) as err:
            raise fail(f"profile {profile}", err) from None
    for workload in experiment.workloads:
        try:
            check_workload(workload)
        except (ValueError, TypeError, KeyError, OSError) as err:
            raise fail(f"workload {workload.label!r}", err) from None
    for task in {(t.policy.title, repr(_params(t)), repr(_engine(t))): t for t in todo}.values():
        try:  # each distinct policy setting once (a trained agent loads once per setting, not per workload)
            make_policy(task.policy.name, **_params(task))
            EngineConfig(**_engine(task))
        except (ValueError, TypeError, OSError) as err:
            raise fail(f"policy {task.policy.title!r} on workload {task.workload.label!r}", err) from None


def episode(task: Task) -> tuple[Policy, EpisodeResult]:
    """The task's episode, on exactly the settings :func:`run_task` scores, and the policy that ran it."""
    policy = make_policy(task.policy.name, **_params(task))
    # With a task: its env (a routing task's: RoutingEnv), the experiment's settings merged on top of its own.
    on_task = {"task": task.task, "split": task.split} if task.task is not None else {}
    env = make_env(policy, max_episode_steps=task.max_steps, workload=task.workload.build(), profile=task.profile,
                   engine=_engine(task), pool=task.pool, **on_task)
    try:
        return policy, run_episode(env, policy, seed=task.seed)
    finally:
        env.close()


def run_task(task: Task) -> TaskResult:
    policy, result = episode(task)
    log = result.log
    metrics = summarize(log, task.ttft_slo_s, task.itl_slo_s)
    metrics["truncated"] = float(result.truncated)
    gaps = inter_token_latencies(log)
    gaps = np.concatenate(gaps) if gaps else np.zeros(0)
    if gaps.size > ITL_SAMPLE:
        gaps = np.random.default_rng(task.seed).choice(gaps, ITL_SAMPLE, replace=False)
    series = {}
    diagnostics = policy.diagnostics()
    if diagnostics:  # the policy's own per-step signals beside the step log's batch, queue and KV use
        if "container" in diagnostics:  # a pool's rows interleave its containers: keep container 0's, as the log
            mine = np.asarray(diagnostics["container"]) == 0
            diagnostics = {name: np.asarray(values)[mine] for name, values in diagnostics.items()}
        steps = log.steps(0)
        n = min(steps.shape[0], *(len(values) for values in diagnostics.values()))
        series = {
            "time_s": steps[:n, STEP_INDEX["end_s"]] - log.arrival_s[0],
            "batch": steps[:n, STEP_INDEX["num_running"]],
            "queue": steps[:n, STEP_INDEX["num_waiting"]],
            "kv_used": steps[:n, STEP_INDEX["num_used_blocks"]] / log.num_kv_blocks,
            **{name: np.asarray(values)[:n] for name, values in diagnostics.items() if name not in ("num_running",
                                                                                                   "num_waiting")},
        }
    ttft = log.first_token_s - log.arrival_s
    return TaskResult(task.policy.title, task.workload.label, task.seed, metrics, ttft, gaps, series)


def run_grid(experiment: Experiment, workers: int | None = None, progress: bool = True,
             store: RunStore | None = None, executor: Executor = PROCESSES) -> list[TaskResult]:
    """Run the whole grid; results come back sorted by (workload, policy, seed) whatever the worker order.

    Every input is validated here first (:func:`check_inputs`). With a ``store``, runs already in it are not run
    again and each new one is saved as it finishes. Ctrl-C
    raises :class:`~servegym.evaluation.executor.Interrupted` with the finished runs (already stored).
    ``executor`` says where the runs go (worker processes here, or Ray tasks).
    """
    todo = tasks(experiment)
    check_inputs(experiment, todo)
    bar = _bar(len(todo), experiment.name) if progress else None
    return run_stored(run_task, todo, workers, store, describe, bar, executor)


def describe(task: Task) -> str:
    return f"run {task.policy.title} on {task.workload.label} seed {task.seed}"


def _bar(total: int, name: str):
    return progress_bar(total, f"compare {name}", "run")
