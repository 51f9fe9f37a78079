"""What a training run's ``config.json`` says about whether its training is complete, read without loading a model
(and without stable-baselines3): the leaderboard marks an unfinished agent and a submission refuses one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run_record(run: str | Path) -> dict[str, Any]:
    """A run's ``config.json``; a ``ValueError`` naming the run when it is missing or not JSON."""
    path = Path(run) / "config.json"
    if not path.is_file():
        raise ValueError(f"{run} is not a servegym train run (no config.json)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a run's record (a JSON object)")
    return data


def unfinished(run: str | Path) -> str | None:
    """Why the run's training is incomplete (``"interrupted by SIGTERM at 19,258 of 30,000 timesteps"``), or None
    when it finished. A record older than the ``status`` field counts as finished; ``running`` is a run still
    training, or one killed outright (SIGKILL, a power cut)."""
    data = run_record(run)
    status = data.get("status")
    if status is None or status == "finished":
        return None
    done, asked = _steps(data.get("timesteps_done") or 0), _steps(data.get("timesteps"))
    steps = f"at {done} of {asked} timesteps"
    if status == "interrupted":
        return f"interrupted by {data.get('stopped_by') or 'a signal'} {steps}"
    if status == "failed":
        return f"failed {steps} ({data.get('error', 'no error recorded')})"
    return f"still running or killed {steps} (config.json says {status!r})"


def _steps(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "?"
