"""``servegym compare`` on a benchmark task: an experiment's ``task`` (``cluster-routing``: router policies on the
routing env), what it defaults and what it refuses. The same grid as Ray tasks is in ``test_ray_executor.py``."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from servegym.cli import main
from servegym.evaluation import ExperimentError, default_experiment, experiment_from_dict, tasks
from servegym.evaluation.grid import run_task
from servegym.metrics import summarize
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode

ROUTING_GRID = """
name: routing-grid
task: cluster-routing
seeds: 1
max_steps: 150
policies: [router-round-robin, router-least-loaded]
"""
"""Two routers on cluster-routing's test data, each episode cut at 150 arrivals (0.4 s)."""


def routing(**changes) -> dict:
    return {"name": "r", "task": "cluster-routing", "policies": ["router-least-loaded"], **changes}


def test_a_task_gives_the_workload_profile_and_limits_of_its_env():
    experiment = experiment_from_dict(routing(seeds=1))
    assert (experiment.task, experiment.split, experiment.max_steps) == ("cluster-routing", "test", 1_000_000)
    [workload] = experiment.workloads
    assert (workload.label, workload.source) == ("cluster-routing", "mooncake-cluster-tiles-test")
    [task] = tasks(experiment)
    assert task.profile == "a100-llama3-8b" and (task.task, task.split) == ("cluster-routing", "test")
    train = experiment_from_dict(routing(split="train", workloads=["shared-prefix"], max_steps=10))
    assert train.workloads[0].source == "shared-prefix" and train.max_steps == 10 and train.split == "train"


def test_a_run_without_a_task_keeps_its_run_store_key():
    task = tasks(default_experiment())[0]
    assert "task=" not in repr(task) and "split=" not in repr(task)
    assert repr(dataclasses.replace(task, task="relaxed")).endswith(", task='relaxed', split='test')")


@pytest.mark.parametrize("changes, message", [
    ({"task": None, "workloads": ["low"]}, "routes arrivals among replicas, but the experiment has no task: give "
                                            "a routing task (task: cluster-routing)"),
    ({"task": "relaxed"}, "routes arrivals among replicas, but task relaxed decides admissions"),
    ({"policies": ["fcfs"]}, "policy 'fcfs' decides admissions, but task cluster-routing decides routes"),
    ({"task": "nope"}, "unknown task 'nope'"),
    ({"task": "mixture"}, "is a mixture of"),
    ({"split": "validation"}, "split must be one of ['train', 'test']"),
    ({"task": None, "workloads": ["low"], "policies": ["fcfs"], "split": "test"}, "split picks a task's data"),
])
def test_an_experiment_refuses_a_policy_its_env_does_not_ask_for(changes, message):
    data = {key: value for key, value in routing(**changes).items() if value is not None}
    with pytest.raises(ExperimentError, match=r"^<experiment>: ") as caught:
        experiment_from_dict(data)
    assert message in str(caught.value)


def test_a_grid_run_on_a_routing_task_is_the_benchmarks_episode():
    experiment = experiment_from_dict(routing(seeds=[3], max_steps=150))
    [task] = tasks(experiment)
    policy = make_policy("router-least-loaded")
    bench = run_episode(make_env(policy, task="cluster-routing", split="test", apply_overrides=False,
                                 max_episode_steps=150), policy, seed=3)
    assert bench.truncated
    assert run_task(task).metrics == {**summarize(bench.log), "truncated": 1.0}


def test_compare_plays_router_policies_on_cluster_routing(tmp_path, capsys):
    spec = tmp_path / "routing.yaml"
    spec.write_text(ROUTING_GRID)
    out = tmp_path / "out"
    assert main(["compare", str(spec), "--out", str(out), "--workers", "1", "--no-plots", "--quiet"]) == 0
    assert "2 policies x 1 workloads x 1 seeds = 2 runs" in capsys.readouterr().out
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["policy"], r["workload"], r["seed"]) for r in rows} == {
        ("router-round-robin", "cluster-routing", "0"), ("router-least-loaded", "cluster-routing", "0")}
    summary = (out / "summary.md").read_text()
    assert "Every run plays task `cluster-routing` (test data)" in summary
    assert "| router-least-loaded (truncated) |" in summary
