"""The wheel a user installs: built from this tree, installed into a fresh venv, run from a folder outside the tree.

The wheel is built offline (``--no-build-isolation``: setuptools and Cython come from the dev venv, where the
``[dev]`` extra puts them) from a copy of the tree without build outputs, so the compiled core is compiled anew.
The fresh venv gets servegym from the wheel alone; its dependencies (numpy, gymnasium, PyYAML, ...) are the dev
venv's, reached through a ``.pth`` path line (whose own ``.pth`` files, the editable install's finder among them,
are not processed), so the test installs nothing from an index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

import servegym.engine
from servegym.cli import PAPER_EXPERIMENTS

ROOT = Path(__file__).resolve().parents[1]
_IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
                                  ".hypothesis", "results", "runs", "studies", "reproduce", "bench", "out", "docs",
                                  "tests", "shared", "*.so", "engine.c")


def not_sources(folder: str, names: list[str]) -> set[str]:
    """What a clean clone lacks (build outputs, caches, run folders, links such as the mutation audit's), and what
    the wheel does not need (docs, tests)."""
    return set(_IGNORED(folder, names)) | {name for name in names if os.path.islink(os.path.join(folder, name))}


def _run(cmd: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    start = time.monotonic()
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"{time.monotonic() - start:6.1f} s  {' '.join(str(c) for c in cmd[:4])} ...")
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with servegym installed from a wheel of this tree; its ``bin`` folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=not_sources)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp / "dist",
          source], tmp, timeout=600)
    (wheel,) = (tmp / "dist").glob("servegym-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], tmp)
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).stdout.strip()
    dev_site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "dev_dependencies.pth").write_text("".join(f"{path}\n" for path in sorted(dev_site)))
    return venv / "bin"


@pytest.mark.slow
def test_the_wheel_ships_the_experiments_profiles_traces_and_compiled_core(installed):
    (wheel,) = installed.parent.parent.glob("dist/servegym-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"servegym/experiments/{name}.yaml" for name in (*PAPER_EXPERIMENTS, "default")} <= names
    assert "servegym/experiments/__init__.py" in names
    assert {"servegym/rl/hyperparams/ppo.yml", "servegym/rl/hyperparams/ppo-residual.yml"} <= names  # --zoo ppo
    assert any(n.startswith("servegym/backends/profiles/") and n.endswith(".json") for n in names)
    assert any(n.startswith("servegym/workloads/data/") and n.endswith(".csv") for n in names)
    assert {f"servegym/workloads/data/mooncake/{name}" for name in (
        "conversation_trace.jsonl.xz", "synthetic_trace.jsonl.xz", "LICENSE-APACHE")} <= names  # the Mooncake traces
    assert "servegym/engine/engine.py" in names  # the source: what runs interpreted where nothing was compiled
    if servegym.engine.compiled_available():  # the tree's compiler built it, so the wheel's build must too
        assert any(n.startswith("servegym/engine/engine.") and n.endswith(".so") for n in names)
    assert not any(n.startswith(("tests/", "experiments/", "docs/")) for n in names)


def _outside(tmp_path: Path) -> Path:
    work = tmp_path / "elsewhere"
    work.mkdir()
    return work


@pytest.mark.slow
def test_the_installed_package_is_the_wheels(installed, tmp_path):
    where = _run([installed / "python", "-c", "import servegym, servegym.engine as e; from servegym.experiments "
                  "import find_experiment; print(servegym.__file__); print(e.compiled_available()); "
                  "print(find_experiment('experiments/twp_paper.yaml'))"], _outside(tmp_path)).stdout.split()
    assert Path(where[0]).resolve().is_relative_to(installed.parent.resolve())  # not the source tree
    assert where[1] == str(servegym.engine.compiled_available())
    assert Path(where[2]).resolve() == Path(where[0]).resolve().parent / "experiments" / "twp_paper.yaml"


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / "docs" / "results").is_dir(), reason="no saved results here (docs/results)")
def test_an_installed_wheel_rederives_the_verdicts_from_saved_results(installed, tmp_path):
    work = _outside(tmp_path)
    done = _run([installed / "servegym", "reproduce", "--from-results", "--results", ROOT / "docs" / "results",
                 "--out", "reproduced"], work)
    assert "[reproduced]" in done.stdout
    assert (work / "reproduced" / "REPRODUCTION.md").read_text().count("| TWP (Desai") == 18


@pytest.mark.slow
def test_an_installed_wheel_compares_a_shipped_experiment_by_name(installed, tmp_path):
    work = _outside(tmp_path)
    done = _run([installed / "servegym", "compare", "twp_paper", "--seeds", "1", "--workers", "2", "--no-plots",
                 "--quiet", "--out", "compared"], work)
    assert "servegym compare: twp_paper:" in done.stdout
    results = (work / "compared" / "results.csv").read_text().splitlines()
    assert results[0] == "policy,workload,seed,metric,value" and len(results) > 100
