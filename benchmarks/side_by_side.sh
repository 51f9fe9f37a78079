#!/usr/bin/env bash
# Run one benchmark script on another commit and on this checkout, as whole processes, one after the other, with
# the same arguments and this checkout's virtual environment: the "before" and "after" of a change, measured in
# one run on one machine.
#
#   benchmarks/side_by_side.sh REV benchmarks/rl_speed.py --section vec
#
# REV is checked out into a temporary worktree (removed at exit) and its compiled extensions are built there; its
# packages are put on PYTHONPATH under one import root laid out as pyproject.toml's package-dir says. Both runs
# start from a directory outside the trees, so neither imports the other's source.
set -euo pipefail
rev=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
python="$root/.venv/bin/python"
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/tree" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$root" worktree add -q --detach "$tmp/tree" "$rev"
(cd "$tmp/tree" && "$python" setup.py build_ext --inplace -q >/dev/null 2>&1)
"$python" - "$tmp/tree" "$tmp/import" <<'PY'
import sys
import tomllib
from pathlib import Path

tree, target = Path(sys.argv[1]), Path(sys.argv[2])
dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
for package, folder in dirs.items():
    link = target.joinpath(*package.split("."))
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(tree / folder)
PY
script=$1
shift
cd "$tmp"
echo "== $rev ($(git -C "$tmp/tree" rev-parse --short HEAD)): $script $*"
PYTHONPATH="$tmp/import" "$python" "$tmp/tree/$script" "$@"
echo "== this checkout ($(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo ', with uncommitted changes')): $script $*"
"$python" "$root/$script" "$@"
