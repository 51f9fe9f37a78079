"""The names the docs give users are the names the code accepts."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

from servegym.engine import EngineConfig
from servegym.envs import ServingEnv
from servegym.pool import PoolConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""The README and the topic pages (CHANGELOG.md is history: it names what used to exist)."""
DOCS = "\n".join(path.read_text() for path in DOC_FILES)


def test_every_argument_in_the_env_docstring_table_is_a_constructor_parameter():
    arguments = ServingEnv.__doc__.split("## Arguments")[1].split("## Version")[0]
    table = [line for line in arguments.splitlines() if line.strip().startswith("| `")]
    documented = {name for line in table for name in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    factory = {"task", "split", "version", "unlocked"}  # make_serving_env's own arguments
    accepted = set(inspect.signature(ServingEnv.__init__).parameters) | factory
    assert documented and documented <= accepted, documented - accepted
    assert accepted - {"self", "render_mode"} <= documented  # and every parameter is documented


def test_engine_and_pool_keys_in_the_readme_exist():
    engine = {f.name for f in fields(EngineConfig)}
    pool = {f.name for f in fields(PoolConfig)}
    for kind, allowed in (("engine", engine), ("pool", pool)):
        for body in re.findall(kind + r"=\{([^}]*)\}", DOCS):
            keys = set(re.findall(r'"([a-z_]+)":', body))
            assert keys and keys <= allowed, (kind, keys - allowed)


def test_readme_cli_flags_exist():
    from servegym.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices  # argparse has no public getter
    nested = {"profile"}  # `servegym profile predict --batch`: flags of a sub-subcommand
    checked = 0
    for command, rest in re.findall(r"servegym (\w+)([^`\n]*)", DOCS):
        if command not in subparsers or command in nested:
            continue
        options = {o for a in subparsers[command]._actions for o in a.option_strings}
        for flag in re.findall(r"(--[a-z][a-z-]+)", rest):
            assert flag in options, f"README: servegym {command} {flag} is not an option"
            checked += 1
    assert checked > 20


def test_the_readme_is_a_map() -> None:
    assert len(README.splitlines()) <= 200


def test_every_relative_link_in_the_docs_resolves() -> None:
    checked = 0
    for path in [*DOC_FILES, ROOT / "CHANGELOG.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name}: link to {target} does not resolve"
            checked += 1
    assert checked > 20


def test_the_policies_table_is_the_registrys() -> None:
    from servegym.policies import POLICIES, policies_table

    table = policies_table()
    assert len(table.splitlines()) == len(POLICIES) + 2
    for path in (ROOT / "README.md", ROOT / "docs" / "POLICIES.md"):
        assert table in path.read_text(), f"{path.name}: regenerate with servegym policies --markdown"
