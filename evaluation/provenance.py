"""What produced a result: the servegym version and the git commit it runs from."""

from __future__ import annotations

import subprocess
from pathlib import Path

from servegym import ENV_ID, __version__


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
    """``servegym 0.2.0, commit abc123, servegym/Serving-v2``: one line for a report's header."""
    return f"servegym {__version__}, commit {source_commit()}, {ENV_ID}"
