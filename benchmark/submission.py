"""Submitting a trained agent to the benchmark and verifying a submission (``servegym bench --agent / --verify``).

A submission is one JSON file: the agent's test-track rows on all of its task's frozen test seeds (exactly the
task's settings, :mod:`servegym.benchmark.bench`), bound to what produced them: the servegym version and commit,
the env id, the track, the task's settings, the SHA-256 of every file that decides the agent's actions (model,
normalization statistics, ``config.json`` with its base parameters) and one digest over them, and the training
record (status, timesteps, the splits and seeds it saw). Verifying checks each stamp against this servegym and the
run, then replays the agent on the same seeds and checks every number; episodes are deterministic, so they must
match to the last digit. Any difference exits 1.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from servegym import ENV_ID, __version__
from servegym.benchmark.bench import TEST_TRACK, BenchRow, Entry, make_entries, run_bench, task_test_seeds
from servegym.benchmark.provenance import RECORD, source_commit, unranked_reasons
from servegym.envs.tasks import get_task

FORMAT = 2
"""The submission file's format version (2: bound to the agent's files, its training record and the full test
seeds; format 1 is refused)."""


def agent_files(run: Path) -> dict[str, str]:
    """The SHA-256 of every file that decides the agent's actions: the model it loads (its best, else its final
    one), the normalization statistics saved with it, and ``config.json`` (the action mode, the scorer base's
    parameters, the observation scaling the policy is rebuilt from)."""
    from servegym.rl.agent import _model_files

    model, stats = _model_files(run, "best")
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in (model, stats, run / "config.json") if path.is_file()}


def agent_digest(files: dict[str, str]) -> str:
    """One SHA-256 over the agent's files (:func:`agent_files`), their names included."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def training_summary(run: Path) -> dict[str, Any]:
    """The run's training record: its status, the timesteps asked and done, and its data record (the splits,
    workloads and seeds it and its base files saw, :mod:`servegym.benchmark.provenance`)."""
    from servegym.rl.runs import run_record

    data = run_record(run)
    return {"status": data.get("status", "finished"), "timesteps": data.get("timesteps"),
            "timesteps_done": data.get("timesteps_done"), RECORD: data.get(RECORD)}


def agent_entry(run: str | Path) -> Entry:
    """The leaderboard entry of a trained run; it must have trained on a benchmark task, to the end, on this env
    version and training data only: an interrupted run, or one whose record shows test data or another env, is
    refused."""
    from servegym.rl.runs import unfinished

    (entry,) = make_entries((), (), [run])
    why = unfinished(run)
    if why is not None:
        raise ValueError(f"{run}: its training was {why}; a submission is a finished agent: finish it with "
                         f"servegym train --resume {run}")
    reasons = unranked_reasons(training_summary(Path(run))[RECORD])
    if reasons:
        raise ValueError(f"{run}: {'; '.join(reasons)}; a submission is an agent trained on {ENV_ID}'s training "
                         "data only")
    if len(entry.tasks) != 1:
        raise ValueError(f"{run}: an agent is submitted on the task it trained on, and its config.json names none")
    return entry


def task_settings(task: str) -> dict[str, Any]:
    """Everything the task fixes, as the test split builds it."""
    spec = get_task(task)
    return {"components": list(spec.components)} if spec.is_mixture else spec.env_kwargs("test")


def replay(run: str | Path, task: str, seeds: tuple[int, ...], workers: int | None = None,
           progress: bool = False) -> list[dict[str, Any]]:
    """The agent's test-track rows on ``seeds`` of ``task``, labelled ``rl:<run name>``, whatever its record says
    (:func:`verify` reports that apart, :func:`submit` refuses it first)."""
    (entry,) = make_entries((), (), [run])
    entry = dataclasses.replace(entry, label=f"rl:{Path(run).name}", tasks=(task,))
    return [asdict(row) for row in run_bench([task], [entry], seeds, workers=workers, progress=progress,
                                             validation=())]


def submit(run: str | Path, seeds: tuple[int, ...] | None = None, workers: int | None = None,
           progress: bool = False) -> dict[str, Any]:
    """Run the agent of ``run`` on its task's test seeds (the locked test track; ``seeds`` replays others, which
    :func:`verify` then refuses) and return the submission."""
    entry = agent_entry(run)
    task = entry.tasks[0]
    seeds = task_test_seeds(task) if seeds is None else tuple(seeds)
    rows = replay(run, task, seeds, workers, progress)
    files = agent_files(Path(run))
    return {"format": FORMAT, "servegym_version": __version__, "commit": source_commit(), "env_id": ENV_ID,
            "track": TEST_TRACK, "task": task, "task_settings": task_settings(task), "seeds": list(seeds),
            "agent": {"run": str(run), "files": files, "digest": agent_digest(files)},
            "training": training_summary(Path(run)), "rows": rows}


def write_submission(submission: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(submission, indent=1, sort_keys=True) + "\n")
    return path


def read_submission(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable submission ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a format-{FORMAT} servegym submission (not a JSON object)")
    missing = {"format", "servegym_version", "commit", "env_id", "track", "task", "seeds", "agent", "training",
               "rows"} - set(data)
    if missing or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a format-{FORMAT} servegym submission (format {data.get('format')!r}, "
                         f"missing {sorted(missing)})")
    return data


def verify(path: str | Path, run: str | Path | None = None, workers: int | None = None) -> list[str]:
    """Replay a submission's agent (from ``run``, default the folder it names) on its seeds; return the
    discrepancies (none: verified). Besides every number, each stamp is checked against this servegym and the
    run: the version, commit and env id, the track, the seeds (all of the task's test seeds), the task's settings,
    the agent's files and digest, and its training record (finished, on this env's training data)."""
    data = read_submission(path)
    run = Path(run or data["agent"].get("run", ""))
    problems = [*_stamp_problems(data), *_agent_problems(data, run)]
    replayed = replay(run, data["task"], tuple(data["seeds"]), workers)
    names = [f.name for f in fields(BenchRow)]
    for claimed, actual in zip(data["rows"], replayed, strict=False):
        for name in names:
            a, b = claimed.get(name), actual[name]
            both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
            same = a == b or both_nan  # JSON keeps floats exactly: a replay matches to the last digit
            if not same:
                problems.append(f"seed {actual['seed']}: {name} submitted {a!r}, replayed {b!r}")
    if len(data["rows"]) != len(replayed):
        problems.append(f"rows: {len(data['rows'])} submitted, {len(replayed)} replayed")
    return problems


def _stamp_problems(data: dict[str, Any]) -> list[str]:
    """What the submission's stamps say that this servegym does not: version, commit, env, track, seeds, task."""
    problems = []
    here = {"servegym_version": __version__, "commit": source_commit(), "env_id": ENV_ID, "track": TEST_TRACK}
    for key, value in here.items():
        if data[key] != value:
            problems.append(f"{key}: submitted {data[key]!r}, this servegym has {value!r}")
    for side, commit in (("submitted", data["commit"]), ("this servegym's", here["commit"])):
        if str(commit).endswith("+dirty"):  # two different edits of one commit would compare equal
            problems.append(f"commit: the {side} commit {commit!r} has uncommitted changes, so it does not identify "
                            "the code")
    try:
        seeds = task_test_seeds(data["task"])
    except ValueError as err:
        return [*problems, f"task: {err}"]
    if list(data["seeds"]) != list(seeds):
        problems.append(f"seeds: submitted {len(data['seeds'])} seeds {_span(data['seeds'])}; a submission holds "
                        f"all {len(seeds)} test seeds of {data['task']}, {_span(seeds)}")
    if data.get("task_settings") != json.loads(json.dumps(task_settings(data["task"]))):
        problems.append(f"task {data['task']}: its settings differ from this servegym's")
    return problems


def _agent_problems(data: dict[str, Any], run: Path) -> list[str]:
    """Where the run's files and training record differ from the submitted ones, or keep it off the board."""
    problems = []
    files = agent_files(run)
    claimed = data["agent"].get("files") or {}
    for name in sorted(set(files) | set(claimed)):
        if files.get(name) != claimed.get(name):
            how = ("SHA-256 differs" if name in files and name in claimed else
                   "submitted but not in the run" if name in claimed else "in the run but not submitted")
            problems.append(f"agent file {name}: {how} ({run})")
    if data["agent"].get("digest") != agent_digest(files):
        problems.append(f"agent digest: submitted {data['agent'].get('digest')!r}, the run's files give "
                        f"{agent_digest(files)!r}")
    training = json.loads(json.dumps(training_summary(run)))
    for key in sorted(set(training) | set(data["training"])):
        if training.get(key) != data["training"].get(key):
            problems.append(f"training {key}: submitted {data['training'].get(key)!r}, the run's record says "
                            f"{training.get(key)!r}")
    if training["status"] != "finished":
        problems.append(f"training: the run is {training['status']}, not finished")
    problems += [f"training: {why}" for why in unranked_reasons(training[RECORD])]
    return problems


def _span(seeds: Any) -> str:
    seeds = list(seeds)
    return f"{seeds[0]}-{seeds[-1]}" if seeds else "none"
