"""The command line: the README's main command and its outputs."""

from __future__ import annotations

import csv

from servegym.cli import main


def test_run_prints_a_summary_and_writes_csvs(tmp_path, capsys):
    assert main(["run", "--policy", "fcfs", "--workload", "low", "--seed", "0", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "TTFT P99 (s)" in out and "throughput (req/s)" in out
    with (tmp_path / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows and all(row["state"] == "finished" for row in rows)
    with (tmp_path / "steps.csv").open() as handle:
        steps = list(csv.DictReader(handle))
    assert float(steps[-1]["end_s"]) >= max(float(r["finish_s"]) for r in rows)


def test_listing_commands(capsys):
    assert main(["policies"]) == 0
    assert "fcfs" in capsys.readouterr().out
    assert main(["workloads"]) == 0
    assert "azure-code" in capsys.readouterr().out


def test_bad_profile_is_a_clear_error(tmp_path, capsys):
    assert main(["run", "--profile", str(tmp_path / "missing.json"), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_run_defaults_length_aware_policies_to_predicted_lengths_and_says_so(capsys):
    # TWP, MC, MC-SF and A_min read output lengths; under "unknown" every request would count as max_tokens.
    assert main(["run", "--policy", "twp", "--workload", "low", "--quiet", "--max-steps", "30"]) == 0
    assert "length mode=predicted (the policy reads output lengths)" in capsys.readouterr().out
    assert main(["run", "--policy", "fcfs", "--workload", "low", "--quiet", "--max-steps", "30"]) == 0
    assert "length mode=unknown" in capsys.readouterr().out
    assert main(["run", "--policy", "twp", "--workload", "low", "--quiet", "--max-steps", "30",
                 "--length-mode", "known"]) == 0
    out = capsys.readouterr().out
    assert "length mode=known" in out and "reads output lengths" not in out
