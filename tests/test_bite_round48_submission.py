"""What ``servegym bench --verify`` refuses (issue 48, item 9): dropped rows, a renamed or swapped model, NaN rows,
changed task settings and another format version.

The replay is stubbed: ``submit`` returns fixed rows and ``model_digest`` a fixed digest, so every case states the
rows it feeds the comparison and the exact discrepancies ``verify`` must list (the slow end-to-end replay of a
trained agent is ``tests/test_submission.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields

import pytest

from servegym import ENV_ID
from servegym.cli import main
from servegym.evaluation import submission as sub
from servegym.evaluation.bench import BenchRow

SHA = "ab" * 32
OTHER_SHA = "cd" * 32
SEEDS = [11, 12, 13]


def replayed_rows() -> list[dict]:
    """What the stubbed replay produces: three episodes of ``rl:agent`` on ``relaxed``, the third one NaN in TTFT
    (no request finished) as a real episode can be."""
    return [asdict(BenchRow("relaxed", "rl:agent", 11, -120.5, 1.25, 3.5, 0.75, 0, False, 400)),
            asdict(BenchRow("relaxed", "rl:agent", 12, -98.25, 1.5, 2.75, 0.5, 1, False, 380)),
            asdict(BenchRow("relaxed", "rl:agent", 13, -300.0, 0.0, 9.0, math.nan, 5, True, 1000))]


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    """Stub the replay and the model digest; return a writer of submission files (an exact copy by default)."""
    monkeypatch.setattr(sub, "model_digest", lambda run: {"model": "best_model.zip", "sha256": SHA})
    monkeypatch.setattr(sub, "submit", lambda run, seeds, workers=None, progress=False:
                        {"rows": [row for row in replayed_rows() if row["seed"] in seeds]})

    def write(change=lambda data: None, name="submission.json"):
        data = {"format": sub.FORMAT, "servegym_version": "x", "commit": "y", "env_id": ENV_ID, "track": "test",
                "task": "relaxed", "task_settings": json.loads(json.dumps(sub.task_settings("relaxed"))),
                "seeds": list(SEEDS), "agent": {"run": str(tmp_path / "run"), "model": "best_model.zip",
                                                 "sha256": SHA}, "rows": replayed_rows()}
        change(data)
        path = tmp_path / name
        path.write_text(json.dumps(data))  # JSON writes NaN as NaN and reads it back as float("nan")
        return path

    return write


def test_an_exact_copy_verifies_nan_included(stubbed):
    # The third row's ttft_p99_s is NaN on both sides: NaN != NaN, yet both are NaN, so the rows match.
    assert sub.verify(stubbed()) == []


def test_a_row_dropped_at_the_end_is_a_row_count_difference(stubbed):
    # Two rows submitted for three replayed: the two match field for field (zip stops at the shorter list), so the
    # count is the only discrepancy, and it must be reported.
    path = stubbed(lambda data: data["rows"].pop())
    assert sub.verify(path) == ["rows: 2 submitted, 3 replayed"]


def test_a_row_dropped_in_the_middle_misaligns_the_seeds(stubbed):
    # Rows for seeds 11 and 13 against the replay's 11, 12, 13: the second submitted row (seed 13) is compared with
    # the replay's seed 12, so its seed and every number differ there, and the count differs too.
    path = stubbed(lambda data: data["rows"].pop(1))
    problems = sub.verify(path)
    assert "seed 12: seed submitted 13, replayed 12" in problems
    assert "seed 12: episode_return submitted -300.0, replayed -98.25" in problems
    assert problems[-1] == "rows: 2 submitted, 3 replayed"
    assert not any(p.startswith("seed 11:") for p in problems)


def test_a_renamed_model_is_caught_by_its_label(stubbed):
    # The same numbers under another agent's label: the policy column differs on every row.
    def rename(data):
        for row in data["rows"]:
            row["policy"] = "rl:better-agent"

    problems = sub.verify(stubbed(rename))
    assert problems == [f"seed {s}: policy submitted 'rl:better-agent', replayed 'rl:agent'" for s in SEEDS]


def test_a_swapped_model_file_is_caught_by_its_digest(stubbed, tmp_path):
    # The rows replay exactly, but the file the submission names is not the model that produced it.
    path = stubbed(lambda data: data["agent"].update(sha256=OTHER_SHA))
    assert sub.verify(path) == [f"model: {tmp_path / 'run' / 'best_model.zip'} is not the submitted model "
                                "(SHA-256 differs)"]


def test_a_nan_row_against_a_number_and_a_number_against_nan_are_both_differences(stubbed):
    # Seed 11's TTFT forged to NaN (the replay has 0.75); seed 13's filled in with 0.9 (the replay has NaN).
    def forge(data):
        data["rows"][0]["ttft_p99_s"] = math.nan
        data["rows"][2]["ttft_p99_s"] = 0.9

    problems = sub.verify(stubbed(forge))
    assert problems == ["seed 11: ttft_p99_s submitted nan, replayed 0.75",
                        "seed 13: ttft_p99_s submitted 0.9, replayed nan"]


def test_a_whole_row_of_nans_is_refused_field_by_field(stubbed):
    # Every float of seed 12 set to NaN: each of the four float columns is a difference; ints and text stay equal.
    float_columns = [f.name for f in fields(BenchRow) if f.type == "float"]
    assert float_columns == ["episode_return", "goodput_rps", "e2e_mean_all_s", "ttft_p99_s", "prefix_hit_ratio"]

    def nan_row(data):
        for name in float_columns:
            data["rows"][1][name] = math.nan

    problems = sub.verify(stubbed(nan_row))
    # The stub replays the prefix hit ratio as NaN (its default), so NaN submitted there matches.
    assert [p.split(":")[1].split()[0] for p in problems] == float_columns[:4]
    assert all(p.startswith("seed 12:") for p in problems)


def test_changed_task_settings_are_a_difference(stubbed):
    path = stubbed(lambda data: data["task_settings"].update(workload="high"))
    assert sub.verify(path) == ["task relaxed: its settings differ from this servegym's"]


@pytest.mark.parametrize("version", [0, 2, "1"])
def test_another_format_version_is_refused_before_any_replay(stubbed, monkeypatch, version, capsys):
    # A format-2 (or string "1") file is not read as format 1; nothing is replayed.
    monkeypatch.setattr(sub, "submit", lambda *args, **kwargs: pytest.fail("replayed a refused file"))
    path = stubbed(lambda data: data.update(format=version))
    with pytest.raises(ValueError, match=r"not a format-1 servegym submission \(missing \[\]\)"):
        sub.verify(path)
    assert main(["bench", "--verify", str(path), "--workers", "1"]) == 2
    assert "not a format-1 servegym submission" in capsys.readouterr().err


def test_the_cli_exits_1_and_lists_the_differences(stubbed, capsys):
    assert main(["bench", "--verify", str(stubbed()), "--workers", "1"]) == 0
    assert "verified: all 3 rows" in capsys.readouterr().out
    assert main(["bench", "--verify", str(stubbed(lambda data: data["rows"].pop())), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "NOT verified: 1 difference(s)" in out and "rows: 2 submitted, 3 replayed" in out
