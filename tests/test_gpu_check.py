"""benchmarks/gpu_check.sh in its CPU fallback: the report it writes, and that it says the CUDA path did not run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


@pytest.mark.slow
def test_gpu_check_cpu_fallback_writes_a_report_that_says_cuda_did_not_run(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if shutil.which("timeout") is None:
        pytest.skip("the script budgets its stages with coreutils' timeout")
    report = tmp_path / "report"
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so the fallback runs on every machine. Run from the repository's
    # own .venv (as in CI and the README), the script must find that interpreter by itself.
    env = {**os.environ, "SERVEGYM_REPORT_DIR": str(report), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTHON", None)
    if Path(sys.executable).parent != SCRIPT.parents[1] / ".venv" / "bin":
        env["PYTHON"] = sys.executable
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=SCRIPT.parents[1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the CUDA path is NOT run" in done.stdout
    for name in ("README.md", "profile.json", "calibration.png", "profile.samples.csv", "fidelity.md",
                 "fidelity.csv", "nvidia-smi.txt", "versions.txt", "timing.tsv", "calibrate.log", "fidelity.log"):
        assert (report / name).is_file(), name
    summary = (report / "README.md").read_text()
    assert summary.startswith("# servegym GPU check (cpu-fallback)")
    assert "**The CUDA path was not run**" in summary
    stages = dict(line.split("\t")[:2] for line in (report / "timing.tsv").read_text().splitlines()[1:])
    assert stages == {"versions": "ok", "calibrate": "ok", "profile": "ok", "fidelity": "ok"}
    prov = json.loads((report / "profile.json").read_text())["provenance"]
    assert prov["device"] == "cpu" and prov["threads"] == 1
    assert prov["sweep"]["max_batch"] == 2 and prov["sweep"]["max_context"] == 32  # the fallback's tiny sweep
    assert "torch CUDA" in (report / "versions.txt").read_text()
    assert "first 6 requests" in (report / "fidelity.md").read_text()


def test_gpu_check_refuses_a_folder_that_is_not_a_checkpoint(tmp_path):
    env = {**os.environ, "SERVEGYM_REPORT_DIR": str(tmp_path / "report")}
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "is not a checkpoint folder (no config.json)" in done.stderr


def test_gpu_check_says_which_interpreter_lacks_servegym(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")  # an interpreter that cannot import anything
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "SERVEGYM_REPORT_DIR": str(tmp_path / "report")}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"{fake} cannot import servegym, torch and transformers" in done.stderr
    assert not (tmp_path / "report").exists()  # nothing ran, so no report that could be mistaken for one
