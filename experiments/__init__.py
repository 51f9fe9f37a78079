"""The shipped experiment files, installed as ``servegym.experiments`` (package data of the wheel).

This folder is the one copy: a source checkout reads ``experiments/NAME.yaml`` here, an installed wheel reads the
same files from the package, and ``servegym compare NAME`` or ``servegym reproduce`` find them either way.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
"""Where the shipped ``*.yaml`` files are, in a checkout or an installed package alike."""


def shipped_experiments() -> list[str]:
    """The names of the shipped experiments (file names without ``.yaml``), sorted."""
    return sorted(path.stem for path in FOLDER.glob("*.yaml"))


def find_experiment(text: str) -> Path:
    """The experiment file ``text`` names: an existing file, else a shipped experiment by name (``twp_paper``),
    file name (``twp_paper.yaml``) or checkout path (``experiments/twp_paper.yaml``, so that the README's
    commands work from an installed wheel too). Anything else is a ``ValueError`` listing the shipped names."""
    path = Path(text)
    if path.is_dir():
        raise ValueError(f"experiment {text} is a folder; give an experiment file (.yaml) or the name of a shipped "
                         f"experiment ({', '.join(shipped_experiments())})")
    if path.is_file():
        return path
    name = path.stem if path.suffix in (".yaml", ".yml") and path.parent in (Path("."), Path("experiments")) else text
    if name in shipped_experiments():
        return FOLDER / f"{name}.yaml"
    raise ValueError(f"experiment {text!r} is neither a file nor a shipped experiment; shipped: "
                     f"{', '.join(shipped_experiments())}")
