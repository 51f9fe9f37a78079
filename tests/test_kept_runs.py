"""``servegym scenarios`` and ``servegym flow-regime`` keep what they promise to keep (issue 48): each finished run
is stored as it finishes, a stop says how many are kept, and the same command re-run redoes only the missing runs
and prints the same report as one uninterrupted run.

The stop is raised from inside the k-th run (as the SIGTERM handler raises it), with one worker so that the runs
are in job order: no timing, so the test holds on a busy machine. One test sends a real SIGTERM to a real process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import servegym.evaluation.grid as grid
import servegym.evaluation.regime as regime
from servegym.cli import main
from servegym.evaluation.executor import RunStore, Terminated
from tests.stop_helpers import kill_session, wait_for_exit, wait_until


class StopAfter:
    """Wrap a run function: raise SIGTERM's stop in the run after ``after`` runs have finished; count runs."""

    def __init__(self, fn, after: int | None) -> None:
        self.fn, self.after, self.calls = fn, after, 0

    def __call__(self, task):
        if self.after is not None and self.calls == self.after:
            raise Terminated
        self.calls += 1
        return self.fn(task)


def _one_cell(monkeypatch) -> None:
    """flow-regime over one cell (10 runs a seed) instead of 48."""
    cell = regime.Cell(20, 0.9, 1024, "restart")
    monkeypatch.setattr(regime, "cells", lambda: [cell])


COMMANDS = {
    "scenarios": (["scenarios", "--only", "low", "--seeds", "2"], grid, "run_task", 26),
    "flow-regime": (["flow-regime", "--seeds", "2"], regime, "_run_quietly", 20),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_stopped_command_keeps_its_runs_and_the_rerun_redoes_only_the_rest(command, tmp_path, monkeypatch,
                                                                            capsys):
    argv, module, name, total = COMMANDS[command]
    if command == "flow-regime":
        _one_cell(monkeypatch)
    original = getattr(module, name)

    def run(folder: str, after: int | None) -> tuple[int, StopAfter, str]:
        counter = StopAfter(original, after)
        monkeypatch.setattr(module, name, counter)
        rc = main([*argv, "--workers", "1", "--quiet", "--runs", str(tmp_path / folder),
                   "--out", str(tmp_path / f"{folder}.md")])
        return rc, counter, capsys.readouterr().err

    rc, first, err = run("stopped", after=7)
    assert rc == 143 and first.calls == 7
    assert err.strip().splitlines()[-1] == "servegym: terminated (SIGTERM); 7 finished runs kept (re-run the same " \
                                           "command to finish)"
    assert len(RunStore(tmp_path / "stopped" / "runs")) == 7 and not (tmp_path / "stopped.md").exists()

    rc, second, _ = run("stopped", after=None)
    assert rc == 0 and second.calls == total - 7  # only what was not stored
    rc, whole, _ = run("whole", after=None)
    assert rc == 0 and whole.calls == total
    assert (tmp_path / "stopped.md").read_text() == (tmp_path / "whole.md").read_text()

    rc, again, _ = run("whole", after=None)  # everything kept: nothing runs
    assert rc == 0 and again.calls == 0
    monkeypatch.setattr(module, name, fresh := StopAfter(original, None))
    assert main([*argv, "--workers", "1", "--quiet", "--fresh", "--runs", str(tmp_path / "whole")]) == 0
    assert fresh.calls == total and len(RunStore(tmp_path / "whole" / "runs")) == total  # --fresh forgets them


def test_an_unwritable_report_path_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grid, "run_stored", lambda *a, **k: pytest.fail("a run started"))
    (tmp_path / "file").write_text("")
    rc = main(["scenarios", "--only", "low", "--seeds", "1", "--quiet", "--runs", str(tmp_path / "r"),
               "--out", str(tmp_path / "file" / "S.md")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("servegym: error: output folder") and "is not a folder" in err
    assert "Errno" not in err


def test_a_runs_folder_in_use_is_refused(tmp_path, capsys):
    from servegym.evaluation.executor import FolderLock

    with FolderLock(tmp_path / "r"):
        assert main(["flow-regime", "--seeds", "1", "--quiet", "--runs", str(tmp_path / "r")]) == 2
    assert "is being written by another servegym run" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_to_a_real_scenarios_process_keeps_its_runs_and_the_rerun_matches(tmp_path):
    def command(folder: str) -> list[str]:
        return [sys.executable, "-m", "servegym.cli", "scenarios", "--only", "low", "medium", "--seeds", "3",
                "--workers", "2", "--quiet", "--runs", str(tmp_path / folder), "--out", str(tmp_path / f"{folder}.md")]

    store = tmp_path / "stopped" / "runs"
    proc = subprocess.Popen(command("stopped"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=tmp_path)
    try:
        wait_until("a stored run", lambda: store.is_dir() and any(store.glob("*.pkl")), proc)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = wait_for_exit(proc, time.monotonic())
    finally:
        kill_session(proc)
    assert proc.returncode == 143, err
    kept = len(RunStore(store))
    assert f"{kept} finished runs kept" in err and "Traceback" not in err
    rerun = subprocess.run(command("stopped"), capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"({kept} from before are not run again)" in rerun.stdout
    whole = subprocess.run(command("whole"), capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert whole.returncode == 0, whole.stderr
    assert Path(tmp_path / "stopped.md").read_text() == Path(tmp_path / "whole.md").read_text()
