"""``servegym tune``'s input checked before any trial: count bounds (CLI and Python API alike), the report folder and
the storage path, each a one-line error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from servegym.cli import main  # noqa: E402
from servegym.tuning import TuneConfig, TuningError, make_storage  # noqa: E402


def tune_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["tune", "--policy", "flow-control", "--workload", "low", "--trials", "1", "--seeds", "1", "--eval-seeds",
            "1", "--max-steps", "50", "--pruner", "none", "--storage", f"sqlite:///{tmp_path}/s.db", "--quiet", *extra]


def one_error_line(err: str) -> str:
    """The one line of ``err`` that says what is wrong (argparse prints its usage lines above it)."""
    assert "Traceback" not in err and "Errno" not in err, err
    errors = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(errors) == 1 and err.strip().endswith(errors[0]), err
    return errors[0]


@pytest.mark.parametrize(("flags", "message"), [
    (("--seeds", "1000000000"), "argument --seeds: must be a whole number in [1, 10,000] (each seed is one episode "
                                "per policy and workload), got 1,000,000,000"),
    (("--seeds", "20000"), "argument --seeds: must be a whole number in [1, 10,000]"),
    (("--seeds", "0"), "argument --seeds: must be a whole number in [1, 10,000]"),
    (("--eval-seeds", "1e9"), "argument --eval-seeds: expected a whole number, got '1e9'"),
    (("--eval-seeds", "10001"), "argument --eval-seeds: must be a whole number in [1, 10,000]"),
    (("--trials", "100001"), "argument --trials: must be a whole number in [0, 100,000] (each trial runs its seeds' "
                             "episodes), got 100,001"),
    (("--trials", "-3"), "argument --trials: must be a whole number in [0, 100,000]"),
    (("--max-steps", "0"), "argument --max-steps: must be a whole number in [1, 1,000,000,000]"),
])
def test_counts_out_of_bounds_are_usage_errors_before_any_trial(tmp_path, capsys, flags, message):
    # Rule: every count is bounded by servegym.validation.COUNT_LIMITS and refused by argparse (exit 2, one error
    # line, no "invalid ... value" wording) before the storage is touched.
    with pytest.raises(SystemExit) as stop:
        main(tune_args(tmp_path, *flags))
    assert stop.value.code == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"servegym tune: error: {message}" or line.startswith(f"servegym tune: error: {message}"), line
    assert "invalid" not in line
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("seeds", 10**9, "seeds must be a whole number in [1, 10,000]"),
    ("eval_seeds", 1e9, "eval_seeds must be a whole number in [1, 10,000]"),
    ("eval_seeds", 2.5, "eval_seeds must be a whole number in [1, 10,000] (each seed is one episode per policy and "
                        "workload), got 2.5"),
    ("trials", 100_001, "trials must be a whole number in [0, 100,000]"),
    ("trials", True, "trials must be a whole number"),
    ("max_steps", 0, "max_steps must be a whole number in [1, 1,000,000,000]"),
])
def test_the_python_api_applies_the_same_count_rule(field, value, message):
    with pytest.raises(ValueError) as caught:
        TuneConfig(policy="flow-control", workload="low", **{field: value})
    assert str(caught.value).startswith(message), caught.value


def test_whole_float_counts_become_ints():
    # An experiment file's 3.0 is the count 3 (the rule accepts whole floats), stored as an int.
    cfg = TuneConfig(policy="flow-control", workload="low", trials=4.0, seeds=3.0)
    assert (cfg.trials, cfg.seeds) == (4, 3) and type(cfg.trials) is int and type(cfg.seeds) is int


def test_an_unusable_report_folder_is_refused_before_the_first_trial(tmp_path, capsys):
    # Rule: the report folder is checked before any trial runs (the storage is never even created), unless
    # --no-report, which writes no report and so ignores --out.
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "report"
    assert main(tune_args(tmp_path, "--out", str(out))) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"servegym: error: output folder {out} is not writable: {tmp_path / 'file'} exists and is not a " \
                   "folder"
    assert not (tmp_path / "s.db").exists()
    assert main(tune_args(tmp_path, "--out", str(out), "--no-report")) == 0
    assert (tmp_path / "s.db").is_file()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_report_folder_is_refused_before_the_first_trial(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(tune_args(tmp_path, "--out", str(locked / "report"))) == 2
    finally:
        locked.chmod(0o700)
    assert "is not writable: Permission denied" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize(("kind", "where", "message"), [
    ("sqlite", "folder", "{path} is a folder, not a file; name a file in it, such as {path}/studies.db"),
    ("journal", "folder", "{path} is a folder, not a file; name a file in it, such as {path}/studies.journal"),
    ("sqlite", "under a file", "{file} is a file, not a folder, so {path} cannot be made"),
    ("journal", "under a file", "{file} is a file, not a folder, so {path} cannot be made"),
])
def test_a_bad_storage_path_is_one_plain_line(tmp_path, capsys, kind, where, message):
    # Rule: a storage path that is a folder, or lies under a file, is named in one sentence (no "[Errno 20]").
    file = tmp_path / "file"
    file.write_text("")
    path = tmp_path if where == "folder" else file / "sub" / "s.db"
    url = f"sqlite:///{path}" if kind == "sqlite" else f"journal:{path}"
    args = [a if a != f"sqlite:///{tmp_path}/s.db" else url for a in tune_args(tmp_path, "--no-report")]
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"servegym: error: storage {url!r}: " + message.format(path=path, file=file), line
    assert file.read_text() == ""


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_storage_in_a_read_only_folder_is_one_plain_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(TuningError, match=r"cannot write .*s\.db \(Permission denied\)$"):
            make_storage(f"sqlite:///{locked}/s.db")
    finally:
        locked.chmod(0o700)
