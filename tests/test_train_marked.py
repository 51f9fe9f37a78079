"""An agent whose training did not finish is never passed off as a finished one (issue 48): its ``config.json``
says so, ``servegym bench`` marks it ``[interrupted]`` on the board, and a submission refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servegym.benchmark.bench import BenchRow, make_entries
from servegym.benchmark.board import INTERRUPTED_MARK, boards
from servegym.benchmark.leaderboard import markdown
from servegym.benchmark.provenance import data_record
from servegym.cli import main
from servegym.rl.runs import unfinished

ROOT = Path(__file__).resolve().parents[1]


def run_folder(parent: Path, name: str, **record) -> Path:
    run = parent / name
    run.mkdir()
    clean = data_record("memory-tight", "train", None, {"train": [0, 100_000]})  # current env, training data
    (run / "config.json").write_text(json.dumps({"algo": "ppo", "task": "memory-tight", "timesteps": 30_000,
                                                 "provenance": clean, **record}))
    return run


@pytest.mark.parametrize(("record", "why"), [
    ({"status": "finished", "timesteps_done": 30_720}, None),
    ({}, None),  # a record from before the status field
    ({"status": "interrupted", "stopped_by": "SIGINT", "timesteps_done": 1_234},
     "interrupted by SIGINT at 1,234 of 30,000 timesteps"),
    ({"status": "failed", "error": "FloatingPointError: nan", "timesteps_done": 128},
     "failed at 128 of 30,000 timesteps (FloatingPointError: nan)"),
    ({"status": "running", "timesteps_done": 0}, "still running or killed at 0 of 30,000 timesteps (config.json says "
                                                 "'running')"),
])
def test_unfinished_reads_the_record(tmp_path, record, why):
    assert unfinished(run_folder(tmp_path, "r", **record)) == why


def test_the_kept_sac_run_is_the_interrupted_one():
    sac = ROOT / "docs" / "rl" / "Serving-v1__sac__params__memory-tight__s0"
    assert unfinished(sac) == "interrupted by SIGTERM at 19,258 of 30,000 timesteps"
    assert unfinished(ROOT / "docs" / "rl" / "Serving-v1__ppo__score__memory-tight__s0") is None


def test_an_interrupted_agent_is_marked_on_the_board_and_only_it(tmp_path):
    done = run_folder(tmp_path, "A__s0", status="finished", timesteps_done=30_720)
    stopped = run_folder(tmp_path, "A__s1", status="interrupted", stopped_by="SIGTERM", timesteps_done=100)
    entries = make_entries(["fcfs"], (), [done, stopped])  # any caller, not only the CLI, gets the mark
    assert [e.label for e in entries] == ["fcfs", "rl:A__s0", "rl:A__s1 [interrupted]"]
    assert [e.policy for e in entries] == ["fcfs", f"rl:{done}", f"rl:{stopped}"]  # the agent itself is unchanged


def rows(task: str, labels: list[str], seeds: int = 2) -> list[BenchRow]:
    return [BenchRow(task, label, seed, -1000.0 - 10 * i - seed, 1.0, 2.0, 3.0, 0, False, 100)
            for i, label in enumerate(labels) for seed in range(seeds)]


def test_the_board_explains_the_mark_and_never_pools_a_marked_agent_with_its_seeds():
    labels = ["fcfs", "rl:A__s0", "rl:A__s1", f"rl:A__s2{INTERRUPTED_MARK}"]
    text = markdown(rows("memory-tight", labels))
    assert f"| rl:A__s2{INTERRUPTED_MARK} |" in text
    assert "`[interrupted]`: an agent whose training stopped before its timesteps (1 on this board)" in text
    groups = boards(rows("memory-tight", labels))[0].agent_groups()
    assert {name: [s.policy for s in runs] for name, runs in groups.items()} == {"rl:A": ["rl:A__s0", "rl:A__s1"]}
    assert "[interrupted]`:" not in markdown(rows("memory-tight", labels[:3]))  # no mark, no note


def test_an_interrupted_agent_is_not_submitted(tmp_path, capsys):
    from servegym.benchmark.submission import agent_entry

    stopped = run_folder(tmp_path, "s", status="interrupted", stopped_by="SIGTERM", timesteps_done=19_258)
    line = (f"servegym: error: {stopped}: its training was interrupted by SIGTERM at 19,258 of 30,000 timesteps; a "
            f"submission is a finished agent: finish it with servegym train --resume {stopped}")
    assert main(["bench", "--agent", str(stopped), "--out", str(tmp_path / "sub"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == line
    assert not (tmp_path / "sub").exists()  # refused before the output folder is made
    done = run_folder(tmp_path, "d", status="finished", timesteps_done=30_720)
    assert agent_entry(done).tasks == ("memory-tight",)
