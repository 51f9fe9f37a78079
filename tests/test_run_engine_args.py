"""``servegym run --engine/--pool`` and the files ``--out`` writes: prefix caching turned on from the command line,
its hit ratio in ``summary.json`` under the registry's metric names, what produced it in ``run.json``."""

from __future__ import annotations

import csv
import json

import pytest

from servegym.cli import main
from servegym.metrics import METRICS


def test_run_turns_prefix_caching_on_and_writes_the_summary_row(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--workload", "shared-prefix", "--quiet", "--max-steps", "3000", "--out", str(out),
                 "--engine", '{"prefix_caching": true}', "--pool", '{"num_containers": 1}']) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == set(METRICS)
    assert summary["prefix_hit_ratio"] > 0.3  # shared system prompts and multi-turn sessions: most prompts reuse
    with (out / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    cached = sum(int(r["cached_gpu_tokens"]) + int(r["cached_host_tokens"]) for r in rows if r["admit_s"] != "nan")
    prompt = sum(int(r["num_prompt_tokens"]) for r in rows if r["admit_s"] != "nan")
    assert summary["prefix_hit_ratio"] == pytest.approx(cached / prompt, rel=1e-12)
    run = json.loads((out / "run.json").read_text())
    assert run["engine"]["prefix_caching"] is True and run["pool"] == {"num_containers": 1}


def test_run_without_prefix_caching_has_no_hits_and_no_cache_columns(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--workload", "shared-prefix", "--quiet", "--max-steps", "3000", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["prefix_hit_ratio"] == 0.0
    with (out / "requests.csv").open() as handle:
        assert "cached_gpu_tokens" in next(csv.reader(handle))  # the workload has chains: the columns are there


@pytest.mark.parametrize(("flag", "text", "message"), [
    ("--engine", '{"prefix_cachin": true}', "unknown key"),
    ("--engine", "[1]", "must be a JSON object"),
    ("--pool", "{", "must be a JSON object"),
])
def test_bad_engine_or_pool_json_is_one_line_and_exit_2(flag, text, message, tmp_path, capsys):
    assert main(["run", "--quiet", flag, text, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
