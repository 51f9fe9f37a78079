"""What ``servegym bench --verify`` refuses (issue 48, item 9; issue 51, item 1): dropped rows, a renamed or swapped
model, NaN rows, changed task settings, another format version, and every stamp that binds a submission to what
made it: version, commit, env, track, seeds, the agent's files and digest, and its training record.

The replay is stubbed: ``replay`` returns fixed rows, ``agent_files`` fixed digests, ``training_summary`` a fixed
record, the commit and the task's test seeds fixed values, so every case states what it feeds the comparison and
the exact discrepancies ``verify`` must list (the slow end-to-end replay of a trained agent is
``tests/test_submission.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields

import pytest

from servegym import ENV_ID, __version__
from servegym.benchmark import submission as sub
from servegym.benchmark.bench import BenchRow
from servegym.cli import main

SHA = "ab" * 32
OTHER_SHA = "cd" * 32
SEEDS = [11, 12, 13]
FILES = {"best_model.zip": SHA, "config.json": "ef" * 32}
CLEAN = {"env_id": ENV_ID, "split": "train", "workload": None, "task": "relaxed", "seeds": {"train": [0, 100_000]},
         "inputs": {}}
TRAINING = {"status": "finished", "timesteps": 20_000, "timesteps_done": 20_480, "provenance": CLEAN}


def replayed_rows() -> list[dict]:
    """What the stubbed replay produces: three episodes of ``rl:agent`` on ``relaxed``, the third one NaN in TTFT
    (no request finished) as a real episode can be."""
    return [asdict(BenchRow("relaxed", "rl:agent", 11, -120.5, 1.25, 3.5, 0.75, 0, False, 400)),
            asdict(BenchRow("relaxed", "rl:agent", 12, -98.25, 1.5, 2.75, 0.5, 1, False, 380)),
            asdict(BenchRow("relaxed", "rl:agent", 13, -300.0, 0.0, 9.0, math.nan, 5, True, 1000))]


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    """Stub the replay and the model digest; return a writer of submission files (an exact copy by default)."""
    monkeypatch.setattr(sub, "agent_files", lambda run: dict(FILES))
    monkeypatch.setattr(sub, "training_summary", lambda run: json.loads(json.dumps(TRAINING)))
    monkeypatch.setattr(sub, "source_commit", lambda: "y")
    monkeypatch.setattr(sub, "task_test_seeds", lambda task: tuple(SEEDS))
    monkeypatch.setattr(sub, "replay", lambda run, task, seeds, workers=None, progress=False:
                        [row for row in replayed_rows() if row["seed"] in seeds])

    def write(change=lambda data: None, name="submission.json"):
        data = {"format": sub.FORMAT, "servegym_version": __version__, "commit": "y", "env_id": ENV_ID,
                "track": "test", "task": "relaxed",
                "task_settings": json.loads(json.dumps(sub.task_settings("relaxed"))), "seeds": list(SEEDS),
                "agent": {"run": str(tmp_path / "run"), "files": dict(FILES), "digest": sub.agent_digest(FILES)},
                "training": json.loads(json.dumps(TRAINING)), "rows": replayed_rows()}
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
    # The rows replay exactly, but the model the submission names is not the one in the run; the one digest over
    # the files differs too.
    def swap(data):
        data["agent"]["files"]["best_model.zip"] = OTHER_SHA
        data["agent"]["digest"] = sub.agent_digest(data["agent"]["files"])

    assert sub.verify(stubbed(swap)) == [
        f"agent file best_model.zip: SHA-256 differs ({tmp_path / 'run'})",
        f"agent digest: submitted {sub.agent_digest({**FILES, 'best_model.zip': OTHER_SHA})!r}, the run's files give "
        f"{sub.agent_digest(FILES)!r}"]


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


@pytest.mark.parametrize("version", [1, 3, "2"])
def test_another_format_version_is_refused_before_any_replay(stubbed, monkeypatch, version, capsys):
    # A format-1 (unbound) or format-3 (or string "2") file is not read as format 2; nothing is replayed.
    monkeypatch.setattr(sub, "replay", lambda *args, **kwargs: pytest.fail("replayed a refused file"))
    path = stubbed(lambda data: data.update(format=version))
    with pytest.raises(ValueError, match=rf"not a format-2 servegym submission \(format {version!r}, missing \[\]\)"):
        sub.verify(path)
    assert main(["bench", "--verify", str(path), "--workers", "1"]) == 2
    assert "not a format-2 servegym submission" in capsys.readouterr().err


def test_the_cli_exits_1_and_lists_the_differences(stubbed, capsys):
    assert main(["bench", "--verify", str(stubbed()), "--workers", "1"]) == 0
    assert "verified: all 3 rows" in capsys.readouterr().out
    assert main(["bench", "--verify", str(stubbed(lambda data: data["rows"].pop())), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "NOT verified: 1 difference(s)" in out and "rows: 2 submitted, 3 replayed" in out


# Issue 51, item 1: each stamp tampered with alone is named, and the CLI exits 1 (one case per field).
@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d.update(commit="0123abc"), "commit: submitted '0123abc', this servegym has 'y'"),
    (lambda d: d.update(commit="y+dirty"), "commit: the submitted commit 'y+dirty' has uncommitted changes"),
    (lambda d: d.update(servegym_version="9.9.9"), f"servegym_version: submitted '9.9.9', this servegym has "
                                                  f"{__version__!r}"),
    (lambda d: d.update(env_id="servegym/Serving-v1"), f"env_id: submitted 'servegym/Serving-v1', this servegym "
                                                       f"has {ENV_ID!r}"),
    (lambda d: d.update(track="engine-config"), "track: submitted 'engine-config', this servegym has 'test'"),
    (lambda d: d["agent"]["files"].update({"best_model.zip": OTHER_SHA}), "agent file best_model.zip: SHA-256 "
                                                                          "differs"),
    (lambda d: d["agent"]["files"].update({"final_model.zip": d["agent"]["files"].pop("best_model.zip")}),
     "agent file best_model.zip: in the run but not submitted"),  # the model renamed
    (lambda d: d["agent"]["files"].update({"config.json": OTHER_SHA}), "agent file config.json: SHA-256 differs"),
    (lambda d: d["training"].update(status="interrupted"), "training status: submitted 'interrupted', the run's "
                                                           "record says 'finished'"),
    (lambda d: d["training"].update(timesteps_done=4_096), "training timesteps_done: submitted 4096, the run's "
                                                           "record says 20480"),
])
def test_each_tampered_stamp_is_a_named_difference(stubbed, change, expected, capsys):
    path = stubbed(change)
    problems = sub.verify(path)
    assert any(p.startswith(expected) for p in problems), problems
    assert main(["bench", "--verify", str(path), "--workers", "1"]) == 1
    assert "NOT verified" in capsys.readouterr().out


@pytest.mark.parametrize(("seeds", "expected"), [
    ([12], "seeds: submitted 1 seeds 12-12; a submission holds all 3 test seeds of relaxed, 11-13"),  # cherry-picked
    ([0, 1, 2], "seeds: submitted 3 seeds 0-2; a submission holds all 3 test seeds of relaxed, 11-13"),  # training
])
def test_a_seed_subset_or_training_seeds_are_refused(stubbed, seeds, expected):
    def cut(data):
        data["seeds"] = seeds
        data["rows"] = [row for row in data["rows"] if row["seed"] in seeds]

    assert expected in sub.verify(stubbed(cut))


def test_a_run_whose_record_shows_test_data_or_an_older_env_fails_verification(stubbed, monkeypatch):
    # The rows and every stamp match, but the run itself trained on test windows of another env version.
    dirty = {**CLEAN, "env_id": "servegym/Serving-v1", "workload": "azure-code-window-test"}
    monkeypatch.setattr(sub, "training_summary", lambda run: {**TRAINING, "provenance": dirty})
    path = stubbed(lambda d: d["training"].update(provenance=dirty))
    assert sub.verify(path) == [f"training: made on servegym/Serving-v1, not {ENV_ID}",
                                "training: saw test data (workload 'azure-code-window-test')"]


def test_a_run_still_unfinished_on_both_sides_fails_verification(stubbed, monkeypatch):
    # The submission and the run agree that training was interrupted: no difference between them, yet an
    # unfinished agent is not a verified submission.
    monkeypatch.setattr(sub, "training_summary", lambda run: {**TRAINING, "status": "interrupted"})
    path = stubbed(lambda d: d["training"].update(status="interrupted"))
    assert sub.verify(path) == ["training: the run is interrupted, not finished"]
