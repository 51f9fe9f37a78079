"""Optuna storages for studies: opening one with clear errors, and failing the trials of workers that died."""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

URL_FORMS = "sqlite:///PATH, postgresql://..., mysql://... or journal:PATH"


class TuningError(ValueError):
    """A study cannot be opened or used as asked; the message says why (``servegym tune`` exits with status 2)."""


def worker_id() -> str:
    """``host:pid`` of this process, recorded on each trial it runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def public_url(url: str) -> str:
    """The URL with its password masked (``***``), for messages and reports."""
    if "@" not in url or url.startswith("journal:"):
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def with_driver(url: str) -> str:
    """A ``postgresql://`` URL with the driver named that is installed: psycopg2 (the ``scale`` extra's) or
    psycopg 3. SQLAlchemy's default differs by version (2.0: psycopg2, 2.1: psycopg 3); other URLs are as given."""
    if not url.startswith("postgresql://"):
        return url
    for driver in ("psycopg2", "psycopg"):
        if importlib.util.find_spec(driver) is not None:
            return f"postgresql+{driver}://" + url.removeprefix("postgresql://")
    raise TuningError(f"storage {public_url(url)!r} needs a PostgreSQL driver: pip install 'servegym[scale]'")


def storage_path(url: str) -> Path | None:
    """The file behind a ``journal:PATH`` or ``sqlite:///PATH`` URL (None for a server or an in-memory DB)."""
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:"))
    if url.startswith("sqlite:///") and url.removeprefix("sqlite:///") not in ("", ":memory:"):
        return Path(url.removeprefix("sqlite:///"))
    return None


def _on_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    log.warning("trial %d of study %r failed: its worker %s stopped sending heartbeats", trial.number,
                study.study_name, trial.user_attrs.get("worker", "(unknown)"))


def make_storage(url: str, heartbeat_s: int | None = None) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL: any RDB URL (sqlite:///, postgresql://, mysql://) or ``journal:PATH``
    for a JournalStorage on a shared file (the safest choice for many processes on one machine or an NFS).

    With ``heartbeat_s``, an RDB storage records a running trial's heartbeat every ``heartbeat_s`` seconds,
    and a trial silent for twice that is failed when a worker next starts a trial or opens the study (Optuna's
    heartbeat). Journal files have no heartbeat: :func:`fail_stale_trials` fails their trials by worker pid.
    Raises :class:`TuningError` naming the URL when it cannot be opened (bad URL, missing driver, corrupt file).
    """

    if url.startswith("journal:") and not Path(url.removeprefix("journal:")).name:
        raise TuningError(f"storage {public_url(url)!r} names no file; expected {URL_FORMS}")
    if url.startswith("sqlite:") and storage_path(url) is None:
        raise TuningError(f"storage {public_url(url)!r} is an in-memory database, which worker threads cannot "
                          "share and which is lost when the command ends; name a file: sqlite:///PATH")
    path = storage_path(url)
    if path is not None:
        check_storage_file(path, public_url(url))
    try:
        if url.startswith("journal:"):
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            return JournalStorage(JournalFileBackend(str(path)))
        return _rdb_storage(with_driver(url), heartbeat_s)
    except TuningError:
        raise
    except Exception as err:  # SQLAlchemy, drivers and journal replay raise many kinds
        from sqlalchemy.exc import ArgumentError

        hint = f"; expected {URL_FORMS}" if isinstance(err, ArgumentError) else ""
        raise TuningError(f"cannot open Optuna storage {public_url(url)!r} ({_first_line(err)}){hint}") from None


def check_storage_file(path: Path, shown: str) -> None:
    """Make the folder of a storage file and check the file can be read and written there, so that a bad path is
    one plain sentence naming ``shown`` (the URL) rather than an OS error number. Creates the file if missing
    (SQLite and Optuna's journal both take an empty file as an empty storage)."""
    if path.is_dir():
        example = path / ("studies.journal" if shown.startswith("journal:") else "studies.db")
        raise TuningError(f"storage {shown!r}: {path} is a folder, not a file; name a file in it, such as {example}")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise TuningError(f"storage {shown!r}: {blocking} is a file, not a folder, so {path} cannot be made")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TuningError(f"storage {shown!r}: cannot create the folder {path.parent} "
                          f"({err.strerror or err})") from None
    try:
        with path.open("ab"):  # appends nothing: an existing storage is unchanged
            pass
    except OSError as err:
        raise TuningError(f"storage {shown!r}: cannot write {path} ({err.strerror or err})") from None
    if not os.access(path, os.R_OK):
        raise TuningError(f"storage {shown!r}: cannot read {path} (Permission denied)")


def _rdb_storage(url: str, heartbeat_s: int | None, attempts: int = 5) -> optuna.storages.RDBStorage:
    """An RDBStorage; retried when workers starting together race to create its tables (a table or the schema
    version row "already exists")."""
    import optuna
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    beat = {"heartbeat_interval": heartbeat_s, "heartbeat_stale_trial_callback": _on_stale} if heartbeat_s else {}
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}

    def open_storage() -> optuna.storages.RDBStorage:
        with warnings.catch_warnings():  # Optuna marks the heartbeat experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, engine_kwargs=engine, **beat)

    for attempt in range(attempts - 1):
        try:
            return open_storage()
        except (OperationalError, IntegrityError, ProgrammingError) as err:
            # PostgreSQL reports the race as ProgrammingError (DuplicateTable); other programming errors are real.
            if isinstance(err, ProgrammingError) and "already exists" not in str(err):
                raise
            time.sleep(0.1 * (attempt + 1))
    return open_storage()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def fail_stale_trials(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
    """Mark failed the RUNNING trials whose worker is gone; return their numbers. ``storage`` is the study's.

    Two rules. An RDB storage opened with a heartbeat uses Optuna's: a trial silent for the grace period is
    failed, wherever its worker ran. On any storage, a RUNNING trial whose ``worker`` (``host:pid``) is on this
    host, where no process has that pid any more, is failed at once (this covers journal files, which have no
    heartbeat, and a worker killed before its first heartbeat). Trials of journal workers on other hosts stay
    RUNNING until a worker on their host opens the study; a reused pid keeps its trial RUNNING (never the reverse).
    """
    import optuna

    running, failed = optuna.trial.TrialState.RUNNING, []
    if isinstance(storage, optuna.storages.RDBStorage) and storage.get_heartbeat_interval():
        before = [t.number for t in study.get_trials(deepcopy=False, states=(running,))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
        failed = [n for n in before if states[n] == optuna.trial.TrialState.FAIL]
    host = socket.gethostname()
    for trial in study.get_trials(deepcopy=False, states=(running,)):
        worker_host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
        if worker_host == host and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            log.warning("trial %d of study %r failed: its worker %s is gone", trial.number, study.study_name,
                        trial.user_attrs["worker"])
            failed.append(trial.number)
    return sorted(failed)
