"""Run every (policy, workload, seed) of an experiment, in parallel worker processes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servegym.engine import STEP_INDEX
from servegym.evaluation.executor import PROCESSES, Executor, RunStore, run_stored
from servegym.evaluation.spec import Experiment, PolicySpec, WorkloadSpec
from servegym.metrics import inter_token_latencies, summarize
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode
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
    return [
        Task(policy, workload, seed, experiment.profile or profile_for(workload.source), experiment.engine,
             experiment.pool, experiment.max_steps,
             experiment.ttft_slo_s, experiment.itl_slo_s)
        for workload in experiment.workloads for policy in experiment.policies for seed in experiment.seeds
    ]


def run_task(task: Task) -> TaskResult:
    params = {**task.policy.params, **task.workload.policy_params.get(task.policy.name, {})}
    policy = make_policy(task.policy.name, **params)
    engine = dict(task.engine)
    if task.workload.length_mode is not None:
        engine["length_mode"] = task.workload.length_mode
    env = make_env(policy, max_episode_steps=task.max_steps, workload=task.workload.build(), profile=task.profile,
                   engine=engine, pool=task.pool)
    result = run_episode(env, policy, seed=task.seed)
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
    env.close()
    return TaskResult(task.policy.title, task.workload.label, task.seed, metrics, ttft, gaps, series)


def run_grid(experiment: Experiment, workers: int | None = None, progress: bool = True,
             store: RunStore | None = None, executor: Executor = PROCESSES) -> list[TaskResult]:
    """Run the whole grid; results come back sorted by (workload, policy, seed) whatever the worker order.

    With a ``store``, runs already in it are not run again and each new one is saved as it finishes. Ctrl-C
    raises :class:`~servegym.evaluation.executor.Interrupted` with the finished runs (already stored).
    ``executor`` says where the runs go (worker processes here, or Ray tasks).
    """
    todo = tasks(experiment)
    bar = _bar(len(todo), experiment.name) if progress else None
    return run_stored(run_task, todo, workers, store, _describe, bar, executor)


def _describe(task: Task) -> str:
    return f"run {task.policy.title} on {task.workload.label} seed {task.seed}"


def _bar(total: int, name: str):
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is optional: install servegym[eval]
        return None
    return tqdm(total=total, desc=f"compare {name}", unit="run")
