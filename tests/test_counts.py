"""One rule for counts (issue 48): every seed, trial, container, worker, env and request count is bounded by
``servegym.validation.COUNT_LIMITS`` and checked before anything is allocated, with one message shape, for the
CLI, experiment files and ``gym.make`` alike. Each probe of the issue that used to hang, eat memory or print a
traceback is here, with the limit's edge (the limit itself passes, one more fails)."""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import pytest

import servegym  # noqa: F401  (registers the envs)
import servegym.evaluation.grid as grid
from servegym.cli import main
from servegym.evaluation import load_experiment
from servegym.validation import COUNT_LIMITS, count, count_arg, expected_requests
from servegym.workloads import Poisson, SyntheticWorkload, TraceWorkload
from servegym.workloads.base import RequestSpec
from servegym.workloads.lengths import Choice


def test_count_accepts_its_limit_and_refuses_one_more_with_the_shared_message():
    limit, why = COUNT_LIMITS["containers"]
    assert count("num_containers", limit, "containers") == limit
    assert count("num_containers", 1, "containers") == 1
    assert count("x", 3.0, "containers") == 3 and isinstance(count("x", 3.0, "containers"), int)  # YAML's 3.0
    with pytest.raises(ValueError) as err:
        count("num_containers", limit + 1, "containers")
    assert str(err.value) == f"num_containers must be a whole number in [1, {limit:,}] ({why}), got {limit + 1:,}"
    for bad in (0, -1, 2.5, True, "3", float("nan"), float("inf"), None):
        with pytest.raises(ValueError, match="num_containers must be a whole number in"):
            count("num_containers", bad, "containers")
    assert count("seed offset", 0, "seeds", low=0) == 0  # low is inclusive too


def test_count_arg_is_a_usage_error_naming_the_flag_not_the_function():
    parser = argparse.ArgumentParser(prog="p", exit_on_error=False)
    parser.add_argument("--seeds", type=count_arg("seeds"))
    assert parser.parse_args(["--seeds", "10000"]).seeds == 10_000
    with pytest.raises(argparse.ArgumentError) as err:
        parser.parse_args(["--seeds", "10001"])
    assert "must be a whole number in [1, 10,000]" in str(err.value) and "got 10,001" in str(err.value)
    with pytest.raises(argparse.ArgumentError, match="expected a whole number, got '1e9'"):
        parser.parse_args(["--seeds", "1e9"])


def test_expected_requests_is_rate_times_duration_against_the_limit():
    limit = COUNT_LIMITS["requests"][0]
    expected_requests("arrivals", 1000.0, limit / 1000.0)  # exactly the limit passes
    with pytest.raises(ValueError, match=r"arrivals: 1e\+09 req/s for 60 s is 6e\+10 expected requests, more than "):
        expected_requests("arrivals", 1e9, 60.0)
    with pytest.raises(ValueError, match="expected requests"):
        expected_requests("arrivals", 1.0, 1e300 * 1e10)  # inf: refused, not compared as a NaN


@pytest.mark.parametrize(("rate", "duration"), [(1e9, 60.0), (1.0, 1e300)])
def test_a_workload_past_the_request_limit_is_refused_before_any_arrival_is_drawn(rate, duration):
    with pytest.raises(ValueError, match="expected requests"):
        SyntheticWorkload(Poisson(rate), duration, Choice((10,), (1.0,)), Choice((5,), (1.0,)))


@pytest.mark.parametrize("workload", ["arrivals: {kind: poisson, rate: 1e9}\n    duration_s: 60",
                                      "arrivals: {kind: poisson, rate: 2}\n    duration_s: 1e300"])
def test_an_experiment_workload_past_the_request_limit_exits_2_before_any_run(workload, tmp_path, capsys,
                                                                                monkeypatch):
    monkeypatch.setattr(grid, "run_stored", lambda *a, **k: pytest.fail("a run started"))
    path = tmp_path / "exp.yaml"
    path.write_text("name: probe\nseeds: 1\npolicies: [fcfs]\nworkloads:\n  - label: big\n    "
                    f"{workload}\n    prompt: {{kind: fixed, value: 10}}\n    output: {{kind: fixed, value: 5}}\n")
    assert main(["compare", str(path), "--out", str(tmp_path / "out"), "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "expected requests" in err and "big" in err
    with pytest.raises(ValueError, match="expected requests"):
        load_experiment(path).workloads[0].build()


def test_gym_make_refuses_a_million_containers_at_once():
    with pytest.raises(ValueError, match=r"num_containers must be a whole number in \[1, 1,024\]"):
        gym.make("servegym/Serving-v2", pool={"num_containers": 10**6})


def test_gym_make_refuses_a_queue_window_past_its_limit():
    limit = COUNT_LIMITS["slots"][0]
    with pytest.raises(ValueError, match=rf"queue_window must be a whole number in \[1, {limit:,}\]"):
        gym.make("servegym/Serving-v2", queue_window=limit + 1)


@pytest.mark.parametrize("argv", [["scenarios", "--seeds", "1000000000"], ["flow-regime", "--seeds", "20000"],
                                  ["flow-regime", "--seeds", "1e9"], ["scenarios", "--workers", "0"],
                                  ["compare", "--workers", "100000"], ["fidelity", "--seeds", "-1"],
                                  ["profile", "predict", "--batch", "x"]])
def test_count_flags_are_one_usage_line_before_any_work(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("servegym ") and "error: argument " in last
    assert "invalid" not in last  # argparse's "invalid _positive value" wording is gone


def test_token_counts_past_the_limit_are_refused_not_wrapped(tmp_path):
    # 1e300 tokens used to come out as -9223372036854775808 (a float cast to int64).
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,1e300,5\n")
    with pytest.raises(ValueError, match="line 2: ContextTokens must be in"):
        TraceWorkload(str(path)).sample(np.random.default_rng(0))
    limit = COUNT_LIMITS["tokens"][0]
    RequestSpec(np.zeros(1), np.array([limit]), np.array([1]))  # the limit itself is a token count
    with pytest.raises(ValueError, match="num_output_tokens must be at most"):
        RequestSpec(np.zeros(1), np.array([1]), np.array([limit + 1]))
    with pytest.raises(ValueError, match="values must be whole token counts in"):
        Choice((10**300,), (1.0,))


def test_a_trace_row_with_more_fields_than_its_header_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,5\n"
                    "2023-11-16 18:15:47.6,10,5,7\n")
    with pytest.raises(ValueError, match="line 3: 4 fields, more than the header's 3"):
        TraceWorkload(str(path)).sample(np.random.default_rng(0))
    wide = tmp_path / "w.csv"  # a header with an extra column allows as many fields
    wide.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,Note\n2023-11-16 18:15:46.6,10,5,x\n")
    assert len(TraceWorkload(str(wide)).sample(np.random.default_rng(0))) == 1


def test_an_os_error_is_one_line_of_path_and_reason_without_its_errno():
    import errno

    from servegym.cli import error_text

    assert error_text(NotADirectoryError(errno.ENOTDIR, "Not a directory", "/tmp/f/x.db")) == \
        "/tmp/f/x.db: not a directory"
    two_files = OSError(errno.EXDEV, "Invalid cross-device link", "a", None, "b")
    assert error_text(two_files) == "a: b: invalid cross-device link"
    assert error_text(PermissionError(errno.EACCES, "Permission denied")) == "permission denied"
    assert error_text(ValueError("two\nlines")) == "two lines"
