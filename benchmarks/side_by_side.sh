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
#
# SIDE_BY_SIDE_ROUNDS=N runs N rounds, alternating the order (before-after, after-before, ...): with an even N a
# machine whose speed drifts during the invocation favours neither side.
set -euo pipefail
rounds=${SIDE_BY_SIDE_ROUNDS:-1}
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "SIDE_BY_SIDE_ROUNDS must be a whole number >= 1, got '$rounds'" >&2
    exit 2
fi
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
before() {
    echo "== $rev ($(git -C "$tmp/tree" rev-parse --short HEAD)): $script $*"
    PYTHONPATH="$tmp/import" "$python" "$tmp/tree/$script" "$@"
}
after() {
    echo "== this checkout ($(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo ', with uncommitted changes')): $script $*"
    "$python" "$root/$script" "$@"
}
for ((round = 0; round < rounds; round++)); do
    if ((round % 2 == 0)); then before "$@"; after "$@"; else after "$@"; before "$@"; fi
done
