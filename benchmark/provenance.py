"""What produced a result: the servegym version and commit it ran from, and the data a tuned parameter file or a
trained agent saw.

A *data record* (:func:`data_record`) is written by ``servegym train`` (into the run's ``config.json``) and by
``servegym tune`` (into ``best_params.json``): the env id, the task, the split and workload whose episodes it
learned from, the seeds of its episodes, and the records of the files it built on (a residual agent's base scorer,
an imitation expert). :func:`unranked_reasons` reads one back and says why the result may not be ranked on this
servegym's board: it saw test data, it was made on another env version, or it has no record at all.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servegym import ENV_ID, __version__

RECORD = "provenance"
"""The key of the data record in a run's ``config.json`` and in a ``best_params.json``."""


def source_commit() -> str:
    """The git commit servegym runs from (``+dirty`` with uncommitted changes outside ``docs/``, where generated
    reports land), or ``unknown`` outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/",
                                ":(top,exclude)docs"], cwd=here,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "") if commit else "unknown"


def stamp() -> str:
    """``servegym 0.3.0, commit abc123, servegym/Serving-v2``: one line for a report's header."""
    return f"servegym {__version__}, commit {source_commit()}, {ENV_ID}"


def data_record(task: str | None, split: str | None, workload: str | None, seeds: Mapping[str, list[int]],
                inputs: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict[str, Any]:
    """What a training run or a study learned from. ``workload`` is the workload its env was given on top of the
    task (None: the task's own for ``split``); ``seeds`` maps a use (``train``, ``validation``, ``tuning``) to
    ``[first, stop)``; ``inputs`` maps the files it built on to their own records (None: a file without one)."""
    return {"env_id": ENV_ID, "servegym_version": __version__, "commit": source_commit(), "task": task,
            "split": split or "train", "workload": workload, "seeds": {k: list(v) for k, v in seeds.items()},
            "inputs": dict(inputs or {})}


def held_out_workloads() -> frozenset[str]:
    """Every workload that holds a task's test data, in any env version (a study or run given one saw test data)."""
    from servegym.envs.tasks import TASKS
    from servegym.workloads import WORKLOADS

    held = {task.test_workload for task in TASKS.values() if task.test_workload}
    return frozenset(held | {name for name in WORKLOADS if name.endswith("-test")})


def _outside_training_data(workload: str) -> bool:
    """Whether ``workload`` replays a trace some task holds test data out of, without being a task's training
    workload (the whole trace, v1's training span, which overlaps v2's test tiles, ...)."""
    from servegym.envs.tasks import TASKS
    from servegym.workloads import WORKLOADS, make_workload

    if workload not in WORKLOADS:
        return False
    held = {getattr(make_workload(t.test_workload), "path", None) for t in TASKS.values() if t.test_workload}
    training = {t.workload for t in TASKS.values() if not t.is_mixture}
    return getattr(make_workload(workload), "path", None) in held and workload not in training


def unranked_reasons(record: Mapping[str, Any] | None) -> list[str]:
    """Why a result with this data record may not be ranked on this servegym's board (empty: it may be)."""
    from servegym.envs.tasks import TEST_SEEDS

    if not isinstance(record, Mapping):
        return ["no provenance record (made before servegym 0.3.0)"]
    reasons = []
    if record.get("env_id") != ENV_ID:
        reasons.append(f"made on {record.get('env_id')}, not {ENV_ID}")
    if record.get("split") == "test":
        reasons.append("saw test data (split 'test')")
    if record.get("workload") in held_out_workloads():
        reasons.append(f"saw test data (workload {record['workload']!r})")
    elif record.get("workload") is not None and _outside_training_data(record["workload"]):
        reasons.append(f"saw data outside the training split (workload {record['workload']!r} replays a trace "
                       "whose held-out part is test data)")
    for use, span in (record.get("seeds") or {}).items():
        if len(span) == 2 and any(span[0] <= seed < span[1] for seed in TEST_SEEDS):
            reasons.append(f"saw test seeds ({use} seeds {span[0]}-{span[1] - 1})")
    for name, nested in (record.get("inputs") or {}).items():
        reasons += [f"its {name} {why}" for why in unranked_reasons(nested)]
    return reasons
