"""Test data cannot enter the board through a side door (issue 51, item 2): training and tuning record what they
saw, and ``servegym bench`` shows a run or params file that saw test data, another env version or nothing on record
apart, never ranked, never a base of the oracle, never the best heuristic."""

from __future__ import annotations

import json

import pytest

from servegym import ENV_ID
from servegym.benchmark.bench import BenchRow, make_entries, make_jobs
from servegym.benchmark.board import boards, is_heuristic, is_unranked
from servegym.benchmark.leaderboard import markdown
from servegym.benchmark.provenance import data_record, held_out_workloads, unranked_reasons
from servegym.rl.config import TrainConfig
from servegym.rl.train import training_record
from servegym.tuning.study import TuneConfig, params_record, study_record, write_params

CLEAN = data_record("long-context", "train", None, {"train": [0, 100_000], "validation": [100_000, 100_005]})


def test_a_clean_record_is_ranked_and_each_fault_is_named():
    assert unranked_reasons(CLEAN) == []
    assert unranked_reasons(None) == ["no provenance record (made before servegym 0.3.0)"]
    assert unranked_reasons({**CLEAN, "env_id": "servegym/Serving-v1"}) == [
        f"made on servegym/Serving-v1, not {ENV_ID}"]
    assert unranked_reasons({**CLEAN, "split": "test"}) == ["saw test data (split 'test')"]
    assert unranked_reasons({**CLEAN, "workload": "azure-code-window-test"}) == [
        "saw test data (workload 'azure-code-window-test')"]
    # The test seeds are 900,000-900,029: a span ending just below them is clean, one reaching the first is not.
    assert unranked_reasons({**CLEAN, "seeds": {"tuning": [899_000, 900_000]}}) == []
    assert unranked_reasons({**CLEAN, "seeds": {"tuning": [899_000, 900_001]}}) == [
        "saw test seeds (tuning seeds 899000-900000)"]
    # A residual agent whose base scorer was tuned on test windows inherits the fault, named.
    assert unranked_reasons({**CLEAN, "inputs": {"score_base": {**CLEAN, "split": "test"}}}) == [
        "its score_base saw test data (split 'test')"]
    assert unranked_reasons({**CLEAN, "inputs": {"imitate": None}}) == [
        "its imitate no provenance record (made before servegym 0.3.0)"]


def test_every_task_test_workload_counts_as_test_data():
    from servegym.envs.tasks import TASKS

    held = {task.test_workload for task in TASKS.values() if task.test_workload}
    assert held and held <= held_out_workloads()
    assert not {task.workload for task in TASKS.values() if not task.is_mixture} & held_out_workloads()


@pytest.mark.parametrize("workload", ["azure-code-window", "azure-code-window-train", "mooncake-conversation",
                                      "mooncake-cluster"])
def test_a_whole_trace_or_v1s_training_span_is_not_training_data(workload):
    # The whole trace holds the test tiles; v1's training span (0-35%, 65-100%) overlaps v2's held-out 32.5-67.5%.
    run = training_record(TrainConfig(task="long-context", workload=workload, timesteps=128))
    assert unranked_reasons(run) == [f"saw data outside the training split (workload {workload!r} replays a trace "
                                     "whose held-out part is test data)"]
    study = study_record(TuneConfig(policy="scorer", workload=workload, objective="return"))
    assert unranked_reasons(study) == unranked_reasons(run)
    # A task's own training workload and a synthetic workload are training data.
    assert unranked_reasons({**CLEAN, "workload": "azure-code-window-train-v2"}) == []
    assert unranked_reasons({**CLEAN, "workload": "tight-memory"}) == []


@pytest.mark.parametrize("key", ["version", "id_task", "unlocked"])
def test_training_refuses_another_env_version(key):
    with pytest.raises(ValueError, match=rf"env must not hold \['{key}'\]: training runs on the current env"):
        TrainConfig(task="long-context", env={key: 0}, timesteps=128)


def test_training_and_tuning_record_what_they_saw(tmp_path):
    run = training_record(TrainConfig(task="long-context", workload="azure-code-window-test", timesteps=128))
    assert (run["env_id"], run["task"], run["split"], run["workload"]) == (
        ENV_ID, "long-context", "train", "azure-code-window-test")
    assert run["seeds"] == {"train": [0, 100_000], "validation": [100_000, 100_005]}
    assert unranked_reasons(run) == ["saw test data (workload 'azure-code-window-test')"]
    study = study_record(TuneConfig(policy="scorer", workload="azure-code-window-train-v2", objective="return",
                                    env={"task": "long-context", "split": "test"}, seeds=3))
    assert study["seeds"]["tuning"] == [10_000, 10_003] and study["split"] == "test"
    path = tmp_path / "best_params.json"
    write_params("scorer", {"output_weight": 2.0}, path, record=study)
    assert params_record(path) == json.loads(json.dumps(study))
    # A residual on that file records it as its input.
    base = training_record(TrainConfig(task="long-context", mode="score", score_base=str(path), timesteps=128))
    assert base["inputs"]["score_base"]["split"] == "test"
    assert unranked_reasons(base) == ["its score_base saw test data (split 'test')"]


def _rows(task: str, labels: list[str], returns: list[float], seeds: int = 3) -> list[BenchRow]:
    return [BenchRow(task, label, 900_000 + s, value + s, 1.0, 2.0, 3.0, 0, False, 100)
            for label, value in zip(labels, returns, strict=True) for s in range(seeds)]


def test_a_test_trained_run_and_a_test_tuned_params_file_never_reach_a_ranked_row(tmp_path):
    test_run = tmp_path / "Serving-v2__ppo__score__long-context__s0"
    test_run.mkdir()
    (test_run / "config.json").write_text(json.dumps({"algo": "ppo", "mode": "score", "task": "long-context",
                                                      "status": "finished",
                                                      "provenance": {**CLEAN, "split": "test"}}))
    params = tmp_path / "scorer-long-context" / "best_params.json"
    write_params("scorer", {"output_weight": 2.0}, params,
                 record={**CLEAN, "workload": "azure-code-window-test"})
    entries = make_entries(["fcfs", "random", "oracle"], [params], [test_run], tasks=["long-context"])
    labels = [entry.label for entry in entries]
    assert labels[3] == "scorer (tuned) [unranked: saw test data (workload 'azure-code-window-test')]"
    assert labels[4] == f"rl:{test_run.name} [unranked: saw test data (split 'test')]"
    oracle_job = next(job for job in make_jobs(["long-context"], entries, [900_000]) if job.entry.policy == "oracle")
    assert not any(is_unranked(b.label) or b.params == {"output_weight": 2.0} for b in oracle_job.bases)  # frozen only
    jobs = make_jobs(["long-context"], entries, [900_000])
    validated = {job.entry.label for job in jobs if job.track == "validation"}
    assert validated == {"fcfs"}  # never a candidate for the best heuristic either
    # Even scoring far above everything, they sit in their own table: not ranked, not the best heuristic.
    rows = _rows("long-context", ["fcfs", "random", labels[3], labels[4]], [-5000.0, -9000.0, -10.0, -20.0])
    (board,) = boards(rows)
    assert [s.policy for s in board.scores] == ["fcfs", "random"]
    assert [s.policy for s in board.unranked] == [labels[3], labels[4]]
    assert board.best_heuristic.policy == "fcfs" and not any(is_unranked(s.policy) for s in board.scores)
    assert not is_heuristic(labels[3]) and is_heuristic("scorer (tuned)")  # never picked as the best heuristic
    text = markdown(rows)
    ranked, apart = text.split("Unranked:")
    assert "scorer (tuned)" not in ranked and "rl:" not in ranked
    assert f"| {labels[3]} |" in apart and f"| {labels[4]} |" in apart


@pytest.mark.parametrize("record", [None, {**CLEAN, "env_id": "servegym/Serving-v1"}])
def test_an_agent_of_an_older_env_or_without_a_record_is_unranked_and_not_submitted(tmp_path, record):
    from servegym.benchmark.submission import agent_entry

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "ppo", "mode": "score", "task": "memory-tight",
                                                 "status": "finished", "provenance": record}))
    (entry,) = make_entries((), (), [run])
    assert is_unranked(entry.label)
    with pytest.raises(ValueError, match="a submission is an agent trained on"):
        agent_entry(run)
