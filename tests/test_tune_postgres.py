"""Optuna on a real PostgreSQL server: two ``servegym tune`` workers on one study, heartbeats, the report.

The module starts its own server from the distribution's binaries (Debian's ``postgresql`` package, which
``.ci/run`` installs) on a free loopback port, and stops it at the end. Without the binaries the tests skip,
unless ``SERVEGYM_REQUIRE_POSTGRES=1`` (set by CI), where they fail.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

optuna = pytest.importorskip("optuna")
psycopg2 = pytest.importorskip("psycopg2")

from servegym.cli import main  # noqa: E402
from servegym.tuning import TuneConfig, TuningError, finished_trials, load_study, make_storage  # noqa: E402
from servegym.tuning import storage as storage_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVEGYM = [sys.executable, "-m", "servegym.cli"]
DATABASES = itertools.count()


def server_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: float(p.parent.parent.name))
    return found[-1].parent if found else None


def as_server_user(root: Path) -> list[str]:
    """The command prefix that runs the server's programs: PostgreSQL refuses root, so root hands ``root`` to the
    ``postgres`` system user (else ``nobody``) and runs them as that user."""
    if os.geteuid() != 0:
        return []
    user = "postgres"
    try:
        pwd.getpwnam(user)
    except KeyError:
        user = "nobody"
    shutil.chown(root, user)
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--"]
    return ["su", user, "-s", "/bin/sh", "-c", '"$0" "$@"']


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A throwaway PostgreSQL server: trust authentication on loopback, its socket in its own folder."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="servegym-postgres-"))
        self.data = self.root / "data"
        self.user = as_server_user(self.root)
        self.port = free_port()

    def run(self, program: str, *args: str) -> None:
        done = subprocess.run([*self.user, str(self.bindir / program), *args], capture_output=True, text=True)
        if done.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.is_file() else ""
            raise RuntimeError(f"{program} {shlex.join(args)} failed:\n{done.stdout}{done.stderr}{tail}")

    def start(self) -> None:
        self.run("initdb", "-D", str(self.data), "-A", "trust", "-U", "servegym", "-E", "UTF8", "--no-sync")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                 "-o", options, "start")

    def stop(self) -> None:
        try:
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def new_database(self) -> str:
        """A fresh database; its URL (with a password the trust rule ignores, to check it is never shown)."""
        name = f"study{next(DATABASES)}"
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="servegym", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        conn.close()
        return f"postgresql://servegym:s3cret@127.0.0.1:{self.port}/{name}"


def no_server(reason: str) -> NoReturn:
    """Skip, except where SERVEGYM_REQUIRE_POSTGRES=1 (CI) says these tests must run: fail there."""
    if os.environ.get("SERVEGYM_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"SERVEGYM_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    bindir = server_binaries()
    if bindir is None:
        no_server("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql")
    server = Server(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def url(server: Server) -> str:
    return server.new_database()


def test_missing_binaries_skip_here_but_fail_in_ci(monkeypatch):
    monkeypatch.delenv("SERVEGYM_REQUIRE_POSTGRES", raising=False)
    with pytest.raises(pytest.skip.Exception):
        no_server("no binaries")
    monkeypatch.setenv("SERVEGYM_REQUIRE_POSTGRES", "1")
    with pytest.raises(pytest.fail.Exception, match="SERVEGYM_REQUIRE_POSTGRES=1 but no binaries"):
        no_server("no binaries")


def test_a_postgresql_url_gets_an_installed_driver_or_one_clear_line(monkeypatch):
    # SQLAlchemy 2.1 reads postgresql:// as psycopg 3, 2.0 as psycopg2; the scale extra installs psycopg2.
    assert storage_module.with_driver("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert storage_module.with_driver("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    installed = {"psycopg", "psycopg2"}
    monkeypatch.setattr(storage_module.importlib.util, "find_spec", lambda name: name if name in installed else None)
    assert storage_module.with_driver("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"  # both: the extra's
    installed.remove("psycopg2")
    assert storage_module.with_driver("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"  # psycopg 3 alone
    installed.clear()
    with pytest.raises(TuningError, match=r"^storage 'postgresql://u:\*\*\*@h/db' needs a PostgreSQL driver: "
                                          r"pip install 'servegym\[scale\]'$"):
        make_storage("postgresql://u:secret@h/db")


def tune_worker(url: str, trials: int) -> subprocess.Popen:
    cmd = [*SERVEGYM, "tune", "--policy", "flow-control", "--workload", "low", "--trials", str(trials), "--seeds",
           "1", "--max-steps", "100", "--storage", url, "--study", "shared", "--pruner", "none", "--no-report",
           "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


def trials_of(url: str, study: str) -> list:
    """The study's trials, read without failing any (no heartbeat check, no pid check)."""
    return optuna.load_study(study_name=study, storage=make_storage(url)).trials


def test_two_workers_share_one_study_on_the_server(url, tmp_path, capsys):
    # Both start at once on an empty database, so they also race to create Optuna's tables. Each is given the
    # study's total (--trials 8) and together they stop at it; how many each ran depends on when it started.
    workers = [tune_worker(url, trials=8) for _ in range(2)]
    for worker in workers:
        out, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err
        assert "s3cret" not in out + err
    trials = [t for t in trials_of(url, "shared") if t.state == optuna.trial.TrialState.COMPLETE]
    host = socket.gethostname()
    ran = {t.user_attrs["worker"] for t in trials}
    assert ran and ran <= {f"{host}:{w.pid}" for w in workers}
    assert len(trials) == 8 and finished_trials(optuna.load_study(study_name="shared", storage=make_storage(url))) == 8
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 8  # the workers sampled apart
    assert len({t.user_attrs["sampler_seed"] for t in trials}) == len(ran)
    report = tmp_path / "report"
    assert main(["tune", "--policy", "flow-control", "--workload", "low", "--trials", "0", "--max-steps", "100",
                 "--eval-seeds", "2", "--storage", url, "--study", "shared", "--out", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "'complete': 8" in (report / "report.md").read_text()
    assert (report / "best_params.json").is_file()
    assert "s3cret" not in printed + (report / "report.md").read_text()


KILLED_MID_TRIAL = """
import os, signal, sys
from servegym.tuning import TuneConfig, tune, study
study.evaluate = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
tune(TuneConfig(policy="flow-control", workload="low", trials=1, seeds=1, storage=sys.argv[1], study_name="killed",
                heartbeat_s=1), progress=False)
"""


def test_a_trial_of_a_killed_worker_on_this_host_is_failed_on_resume(url):
    dead = subprocess.run([sys.executable, "-c", KILLED_MID_TRIAL, url], cwd=ROOT)
    assert dead.returncode < 0
    assert [t.state for t in trials_of(url, "killed")] == [optuna.trial.TrialState.RUNNING]
    cfg = TuneConfig(policy="flow-control", workload="low", storage=url, study_name="killed")
    assert [t.state for t in load_study(cfg).trials] == [optuna.trial.TrialState.FAIL]  # its pid is gone


REMOTE_WORKER = """
import sys, time
from servegym.tuning import TuneConfig, tune, study
study.worker_id = lambda: "another-host:1"  # no pid this host can check: only the heartbeat tells
study.evaluate = lambda *args, **kwargs: time.sleep(600)
tune(TuneConfig(policy="flow-control", workload="low", trials=1, seeds=1, storage=sys.argv[1], study_name="beats",
                heartbeat_s=1), progress=False)
"""


@pytest.mark.slow
def test_heartbeats_keep_a_live_trial_running_and_a_silent_one_is_failed(url):
    cfg = TuneConfig(policy="flow-control", workload="low", storage=url, study_name="beats", heartbeat_s=1)
    worker = subprocess.Popen([sys.executable, "-c", REMOTE_WORKER, url], cwd=ROOT)
    try:
        wait_for(lambda: any(t.user_attrs.get("worker") for t in _trials_or_none(url, "beats")))
        time.sleep(3.0)  # past the 2 s grace: only the worker's heartbeats keep its trial alive
        assert [t.state for t in load_study(cfg).trials] == [optuna.trial.TrialState.RUNNING]
    finally:
        worker.kill()
        worker.wait()
    started = time.monotonic()
    wait_for(lambda: load_study(cfg).trials[0].state == optuna.trial.TrialState.FAIL, timeout=30)
    assert time.monotonic() - started > 0.5  # failed by the silence, not at once


def _trials_or_none(url: str, study: str) -> list:
    try:
        return trials_of(url, study)
    except KeyError:  # the worker has not created the study yet
        return []
