"""Per-task hyperparameter files in the RL Baselines3 Zoo's format (issue 27).

A file is a YAML mapping from env ids (a task's own id, ``servegym/MemoryTight-v2``) to the Zoo's keys:
``n_timesteps``, ``n_envs``, ``policy``, ``normalize``, ``env_kwargs``, ``env_wrapper`` (one of the action
modes' wrappers, ``servegym.rl.wrappers.ScoreAdmit``, say), ``policy_kwargs`` (the Zoo writes it as a
``"dict(...)"`` string) and, as every other key, the algorithm's own arguments. ``servegym train --zoo FILE``
reads the entry of its task; FILE is a path or the name of a file shipped in the package's ``hyperparams/``
folder (``--zoo ppo``, ``--zoo ppo-residual``). servegym's warm start and reward scale have no Zoo key and stay
command-line flags.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from servegym import task_id
from servegym.rl.algorithms import check_hyperparams
from servegym.rl.wrappers import MODES
from servegym.validation import boolean, count

HYPERPARAMS_DIR = Path(__file__).resolve().parent / "hyperparams"
"""The shipped hyperparameter files (package data): ``servegym train --zoo ppo`` reads ``ppo.yml`` here."""

WRAPPERS = {f"servegym.rl.wrappers.{cls.__name__}": mode for mode, cls in MODES.items()}
"""``env_wrapper`` values -> the action mode they name."""
ZOO_POLICIES = ("MultiInputPolicy",)
"""``policy`` values a servegym env takes (its observation is a Dict); servegym picks the network per mode."""


def policy_kwargs(text: str) -> dict[str, Any]:
    """The Zoo's ``"dict(key=value, ...)"`` string (nested ``dict(...)`` too), with literal values only: no code
    is run."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"policy_kwargs {text!r} is not a dict(...) expression") from None
    if not _is_dict_call(call):
        raise ValueError(f"policy_kwargs {text!r} is not a dict(key=value, ...) expression")
    try:
        return _value(call)
    except ValueError:
        raise ValueError(f"policy_kwargs {text!r}: only literal values (numbers, strings, lists, dicts) are "
                         "supported, not names such as nn.ReLU") from None


def _is_dict_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" \
        and not node.args


def _value(node: ast.expr) -> Any:
    if _is_dict_call(node):
        return {kw.arg: _value(kw.value) for kw in node.keywords}
    return ast.literal_eval(node)


def shipped_zoo_files() -> dict[str, Path]:
    """The hyperparameter files that ship inside the package, by name (``ppo`` -> ``.../hyperparams/ppo.yml``)."""
    return {path.stem: path for path in sorted(HYPERPARAMS_DIR.glob("*.yml"))}


def zoo_path(name: str | Path) -> Path:
    """``name`` as a file: an existing path, else a shipped file's name (``ppo`` or ``ppo.yml``)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = shipped_zoo_files()
    if path.name == str(name) and path.stem in shipped and path.suffix in ("", ".yml"):
        return shipped[path.stem]
    raise ValueError(f"--zoo {name} does not exist, and no shipped file has that name (shipped: "
                     f"{', '.join(shipped)}; e.g. --zoo {min(shipped, key=len, default='ppo')})")


def read_zoo(name: str | Path, task: str, algo: str | None = None) -> dict[str, Any]:
    """``TrainConfig`` fields from the entry for ``task`` of the file ``name`` (a path, or a shipped file's name:
    :func:`zoo_path`): ``timesteps``, ``n_envs``, ``normalize``, ``mode``, ``env`` and ``hyperparams`` (each only
    where the entry has it). A malformed file is a ``ValueError`` naming the file and the key; with ``algo`` the
    algorithm's arguments are checked too (:func:`~servegym.rl.algorithms.check_hyperparams`)."""
    import yaml

    path = zoo_path(name)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"--zoo {path}: not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--zoo {path}: not a text file") from None
    env_id = task_id(task)
    if not isinstance(data, dict):
        raise ValueError(f"--zoo {path}: expected a mapping of env ids to hyperparameters, got "
                         f"{type(data).__name__ if data is not None else 'an empty file'}")
    if env_id not in data:
        raise ValueError(f"--zoo {path} has no entry for {env_id} (entries: {sorted(map(str, data))})")
    where = f"--zoo {path} {env_id}"
    if not isinstance(data[env_id], dict):
        raise ValueError(f"{where}: expected a mapping of hyperparameters, got {data[env_id]!r}")
    entry = dict(data[env_id])
    fields: dict[str, Any] = {}
    if "n_timesteps" in entry:
        fields["timesteps"] = count(f"{where}: n_timesteps", entry.pop("n_timesteps"), "steps")
    if "n_envs" in entry:
        fields["n_envs"] = count(f"{where}: n_envs", entry.pop("n_envs"), "envs")
    if "normalize" in entry:
        boolean(f"{where}: normalize", entry["normalize"])
        fields["normalize"] = entry.pop("normalize")
    if "env_kwargs" in entry:
        env_kwargs = entry.pop("env_kwargs")
        if not isinstance(env_kwargs, dict):
            raise ValueError(f"{where}: env_kwargs must be a mapping, got {env_kwargs!r}")
        fields["env"] = dict(env_kwargs)
    if "env_wrapper" in entry:
        wrapper = entry.pop("env_wrapper")
        if not isinstance(wrapper, str) or wrapper not in WRAPPERS:
            raise ValueError(f"{where}: env_wrapper {wrapper!r} is not an action mode; choose from {sorted(WRAPPERS)}")
        fields["mode"] = WRAPPERS[wrapper]
    policy = entry.pop("policy", None)
    if policy is not None and policy not in ZOO_POLICIES:
        raise ValueError(f"{where}: policy {policy!r}: servegym's envs take {ZOO_POLICIES} (the network per mode is "
                         "chosen by servegym)")
    if isinstance(entry.get("policy_kwargs"), str):
        try:
            entry["policy_kwargs"] = policy_kwargs(entry["policy_kwargs"])
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    if algo is not None:
        check_hyperparams(algo, entry, where)
    fields["hyperparams"] = entry
    return fields
