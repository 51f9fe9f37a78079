"""Submitting a trained agent to the benchmark and verifying a submission (``servegym bench --agent / --verify``).

A submission is one JSON file: the agent's test-track rows on its task's frozen test seeds (exactly the task's
settings, :mod:`servegym.evaluation.bench`), stamped with what produced them: the servegym version and commit,
the env id, the task's settings and the agent's model file digest. Verifying replays the same agent on the same
seeds and checks every number; episodes are deterministic, so they must match to the last digit.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from servegym import ENV_ID, __version__
from servegym.envs.tasks import TEST_SEEDS, get_task
from servegym.evaluation.bench import TEST_TRACK, BenchRow, Entry, make_entries, run_bench
from servegym.evaluation.provenance import source_commit

FORMAT = 1
"""The submission file's format version."""


def model_digest(run: Path) -> dict[str, str]:
    """The SHA-256 of the model file the agent loads (its best model, else its final one)."""
    from servegym.rl.agent import _model_files

    model, _ = _model_files(run, "best")
    return {"model": model.name, "sha256": hashlib.sha256(model.read_bytes()).hexdigest()}


def agent_entry(run: str | Path) -> Entry:
    """The leaderboard entry of a trained run; it must have trained on a benchmark task, to the end: an interrupted
    run is refused until ``servegym train --resume`` has finished it."""
    from servegym.rl.runs import unfinished

    (entry,) = make_entries((), (), [run])
    why = unfinished(run)
    if why is not None:
        raise ValueError(f"{run}: its training was {why}; a submission is a finished agent: finish it with "
                         f"servegym train --resume {run}")
    if len(entry.tasks) != 1:
        raise ValueError(f"{run}: an agent is submitted on the task it trained on, and its config.json names none")
    return entry


def task_settings(task: str) -> dict[str, Any]:
    """Everything the task fixes, as the test split builds it."""
    spec = get_task(task)
    return {"components": list(spec.components)} if spec.is_mixture else spec.env_kwargs("test")


def submit(run: str | Path, seeds: tuple[int, ...] = TEST_SEEDS, workers: int | None = None,
           progress: bool = False) -> dict[str, Any]:
    """Run the agent of ``run`` on its task's test seeds (the locked test track) and return the submission."""
    entry = agent_entry(run)
    task = entry.tasks[0]
    rows = [row for row in run_bench([task], [entry], seeds, workers=workers, progress=progress)
            if row.policy == entry.label]
    return {"format": FORMAT, "servegym_version": __version__, "commit": source_commit(), "env_id": ENV_ID,
            "track": TEST_TRACK, "task": task, "task_settings": task_settings(task), "seeds": list(seeds),
            "agent": {"run": str(run), **model_digest(Path(run))}, "rows": [asdict(row) for row in rows]}


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
    missing = {"format", "env_id", "task", "seeds", "agent", "rows"} - set(data)
    if missing or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a format-{FORMAT} servegym submission (missing {sorted(missing)})")
    return data


def verify(path: str | Path, run: str | Path | None = None, workers: int | None = None) -> list[str]:
    """Replay a submission's agent (from ``run``, default the folder it names) on its seeds; return the
    discrepancies (none: verified). A different env id, task settings or model file is a discrepancy too."""
    data = read_submission(path)
    run = Path(run or data["agent"]["run"])
    problems = []
    if data["env_id"] != ENV_ID:
        problems.append(f"env id: submitted on {data['env_id']}, this servegym is {ENV_ID}")
    if data.get("task_settings") != json.loads(json.dumps(task_settings(data["task"]))):
        problems.append(f"task {data['task']}: its settings differ from this servegym's")
    digest = model_digest(run)
    if digest["sha256"] != data["agent"].get("sha256"):
        problems.append(f"model: {run / digest['model']} is not the submitted model (SHA-256 differs)")
    replayed = submit(run, tuple(data["seeds"]), workers)["rows"]
    names = [f.name for f in fields(BenchRow)]
    newer = {f.name for f in fields(BenchRow) if f.default is not MISSING}  # columns added since format 1 began
    for claimed, actual in zip(data["rows"], replayed, strict=False):
        for name in names:
            if name in newer and name not in claimed:  # a file written before the column: nothing claimed
                continue
            a, b = claimed.get(name), actual[name]
            both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
            same = a == b or both_nan  # JSON keeps floats exactly: a replay matches to the last digit
            if not same:
                problems.append(f"seed {actual['seed']}: {name} submitted {a!r}, replayed {b!r}")
    if len(data["rows"]) != len(replayed):
        problems.append(f"rows: {len(data['rows'])} submitted, {len(replayed)} replayed")
    return problems
