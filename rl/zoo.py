"""Per-task hyperparameter files in the RL Baselines3 Zoo's format (issue 27).

A file is a YAML mapping from env ids (a task's own id, ``servegym/MemoryTight-v1``) to the Zoo's keys:
``n_timesteps``, ``n_envs``, ``policy``, ``normalize``, ``env_kwargs``, ``env_wrapper`` (one of the action
modes' wrappers, ``servegym.rl.wrappers.ScoreAdmit``, say), ``policy_kwargs`` (the Zoo writes it as a
``"dict(...)"`` string) and, as every other key, the algorithm's own arguments. ``servegym train --zoo FILE``
reads the entry of its task. servegym's warm start and reward scale have no Zoo key and stay command-line flags.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from servegym import task_id
from servegym.rl.wrappers import MODES

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


def read_zoo(path: str | Path, task: str) -> dict[str, Any]:
    """``TrainConfig`` fields from ``path``'s entry for ``task``: ``timesteps``, ``n_envs``, ``normalize``,
    ``mode``, ``env`` and ``hyperparams`` (each only where the entry has it)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"hyperparameter file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    env_id = task_id(task)
    if not isinstance(data, dict) or env_id not in data:
        found = sorted(data) if isinstance(data, dict) else []
        raise ValueError(f"{path} has no entry for {env_id} (entries: {found})")
    entry = dict(data[env_id])
    fields: dict[str, Any] = {}
    if "n_timesteps" in entry:
        fields["timesteps"] = int(float(entry.pop("n_timesteps")))
    if "n_envs" in entry:
        fields["n_envs"] = int(entry.pop("n_envs"))
    if "normalize" in entry:
        fields["normalize"] = bool(entry.pop("normalize"))
    if "env_kwargs" in entry:
        fields["env"] = dict(entry.pop("env_kwargs"))
    if "env_wrapper" in entry:
        wrapper = entry.pop("env_wrapper")
        if wrapper not in WRAPPERS:
            raise ValueError(f"{path}: env_wrapper {wrapper!r} is not an action mode; choose from {sorted(WRAPPERS)}")
        fields["mode"] = WRAPPERS[wrapper]
    policy = entry.pop("policy", None)
    if policy is not None and policy not in ZOO_POLICIES:
        raise ValueError(f"{path}: policy {policy!r}: servegym's envs take {ZOO_POLICIES} (the network per mode is "
                         "chosen by servegym)")
    if isinstance(entry.get("policy_kwargs"), str):
        entry["policy_kwargs"] = policy_kwargs(entry["policy_kwargs"])
    fields["hyperparams"] = entry
    return fields
