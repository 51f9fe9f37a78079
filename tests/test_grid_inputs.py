"""Every input a grid depends on is loaded and validated once, in the parent, before the first run starts.

Each probe of issue 24 gets a test here: a bad trace, too many seeds, a fractional token count, ``--seeds 0``,
``rate: 1e9`` and a paper symbol used as a parameter name. An error is one line naming the file, line or key,
and the command exits 2 without starting a run.
"""

from __future__ import annotations

import numpy as np
import pytest

import servegym.evaluation.grid as grid
from servegym.cli import main
from servegym.evaluation import Experiment, ExperimentError, PolicySpec, WorkloadSpec, load_experiment, run_grid
from servegym.evaluation.spec import MAX_SEEDS, _yaml_loader
from servegym.policies import POLICIES, make_policy
from servegym.workloads import Choice, RangeMix

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:17:03,10,5\n"
BAD_TRACES = {
    "empty": ("", "line 1: empty file"),
    "header-only": (HEADER, "no requests after the header"),
    "unsorted": (HEADER + "2023-11-16 18:17:04,10,5\n" + ROW, "line 3: TIMESTAMP goes back in time"),
    "negative": (HEADER + ROW + "2023-11-16 18:17:04,-10,5\n", "line 3: ContextTokens must be in "),
    "nan": (HEADER + ROW + "2023-11-16 18:17:04,nan,5\n", "line 3: ContextTokens 'nan' is not a whole number"),
    "malformed": (HEADER + ROW + "2023-11-16 18:17:04;10;5\n", "line 3"),
}


@pytest.fixture
def no_runs(monkeypatch):
    """Fail the test if any run is handed to the executor: a bad input must stop the grid before it starts."""
    def refuse(*args, **kwargs):
        raise AssertionError("a run started despite a bad input")

    monkeypatch.setattr(grid, "run_stored", refuse)


def experiment_file(tmp_path, workload: str, policies: str = "[fcfs]", seeds: str = "1") -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: probe\nseeds: {seeds}\npolicies: {policies}\nworkloads:\n{workload}")
    return str(path)


def compare_cli(path: str, tmp_path, capsys) -> tuple[int, str]:
    rc = main(["compare", path, "--out", str(tmp_path / "out"), "--quiet", "--no-plots", "--workers", "1"])
    return rc, capsys.readouterr().err.strip()


def trace_workload(tmp_path, body: str) -> str:
    (tmp_path / "trace.csv").write_text(body)
    return "  - label: tr\n    trace: {path: trace.csv}\n"


@pytest.mark.parametrize("probe", sorted(BAD_TRACES))
def test_a_bad_trace_stops_compare_before_any_run_with_one_line(probe, tmp_path, capsys, no_runs):
    body, match = BAD_TRACES[probe]
    rc, err = compare_cli(experiment_file(tmp_path, trace_workload(tmp_path, body)), tmp_path, capsys)
    assert rc == 2
    assert len(err.splitlines()) == 1, err  # one line, no worker traceback
    assert "exp.yaml: workload 'tr'" in err and str(tmp_path / "trace.csv") in err and match in err
    assert not (tmp_path / "out" / "runs").exists()  # nothing started, nothing written


@pytest.mark.parametrize("probe", sorted(BAD_TRACES))
def test_run_grid_checks_traces_itself_for_experiments_built_in_code(probe, tmp_path, no_runs):
    # headroom and other callers build Experiment objects directly: run_grid validates before handing out runs.
    body, match = BAD_TRACES[probe]
    (tmp_path / "trace.csv").write_text(body)
    workload = WorkloadSpec("tr", {"trace": {"path": str(tmp_path / "trace.csv")}})
    experiment = Experiment("code", (PolicySpec("fcfs"),), (workload,), seeds=(0,))
    with pytest.raises(ValueError, match=match) as err:
        run_grid(experiment, workers=1, progress=False)
    assert str(err.value).startswith("experiment code: workload 'tr': ")


def test_run_grid_checks_per_workload_policy_params_before_any_run(no_runs):
    # The merged parameters (a workload's policy_params over the policy's) are only built per run: check them.
    workload = WorkloadSpec("low", "low", policy_params={"twp": {"initial_window": -1.0}})
    experiment = Experiment("code", (PolicySpec("twp"),), (workload,), seeds=(0,))
    with pytest.raises(ValueError, match="policy 'twp' on workload 'low': initial_window must be"):
        run_grid(experiment, workers=1, progress=False)


def test_run_grid_checks_profiles_before_any_run(tmp_path, no_runs):
    experiment = Experiment("code", (PolicySpec("fcfs"),), (WorkloadSpec("low", "low"),), seeds=(0,),
                            profile=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"experiment code: profile .*missing.json: profile file .* does not exist"):
        run_grid(experiment, workers=1, progress=False)


def test_a_good_trace_still_runs(tmp_path):
    body = HEADER + ROW + "2023-11-16 18:17:04,20,3\n"
    experiment = load_experiment(experiment_file(tmp_path, trace_workload(tmp_path, body)))
    (result,) = run_grid(experiment, workers=1, progress=False)
    assert result.metrics["num_finished"] == 2


# ------------------------------------------------------------------------------------------------------ seeds
def test_a_huge_seed_count_is_refused_with_the_limit_not_a_memory_error(tmp_path, capsys):
    rc, err = compare_cli(experiment_file(tmp_path, "  - low\n", seeds="1000000000000"), tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert ("exp.yaml: seeds must be a whole number in [1, 10,000] (each seed is one episode per policy and workload), "
            "got 1,000,000,000,000") in err


def test_the_seed_limit_is_inclusive(tmp_path):
    # Rule: 1 <= number of seeds <= MAX_SEEDS, for a count, a list, --seeds and Experiment objects alike.
    assert len(load_experiment(experiment_file(tmp_path, "  - low\n", seeds=str(MAX_SEEDS))).seeds) == MAX_SEEDS
    with pytest.raises(ExperimentError, match=r"seeds must be a whole number in \[1, 10,000\] .* got 10,001"):
        load_experiment(experiment_file(tmp_path, "  - low\n", seeds=str(MAX_SEEDS + 1)))
    with pytest.raises(ExperimentError, match=r"seeds must be a whole number in \[1, 10,000\] .* got 10,001"):
        load_experiment(experiment_file(tmp_path, "  - low\n", seeds=str(list(range(MAX_SEEDS + 1)))))
    experiment = load_experiment(experiment_file(tmp_path, "  - low\n"))
    assert len(experiment.with_seeds(MAX_SEEDS).seeds) == MAX_SEEDS
    for bad in (0, MAX_SEEDS + 1, 10**12):
        with pytest.raises(ValueError, match=rf"seeds must be a whole number in \[1, 10,000\] .* got {bad:,}$"):
            experiment.with_seeds(bad)
    with pytest.raises(ValueError, match=r"seeds must be a whole number in \[1, 10,000\] .* got 0$"):
        Experiment("code", (PolicySpec("fcfs"),), (WorkloadSpec("low", "low"),), seeds=())


def test_scenarios_with_zero_seeds_exits_2_instead_of_a_report_of_nan(tmp_path, capsys, no_runs):
    out = tmp_path / "SCENARIOS.md"
    with pytest.raises(SystemExit) as stop:  # a usage error from the flag's type, before anything runs
        main(["scenarios", "--seeds", "0", "--only", "low", "--quiet", "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("error: argument --seeds: must be a whole number in [1, 10,000] (each seed is one episode "
                        "per policy and workload), got 0")
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ token counts
def test_a_fractional_fixed_length_is_refused_not_truncated(tmp_path, capsys):
    workload = ("  - label: x\n    arrivals: {kind: poisson, rate: 10}\n    duration_s: 5\n"
                "    prompt: {kind: fixed, value: 50.7}\n    output: {kind: fixed, value: 5}\n")
    rc, err = compare_cli(experiment_file(tmp_path, workload), tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "workload 'x': prompt: values must be whole token counts in [1, 100,000,000] (integers), got 50.7" in err


def test_whole_token_counts_are_kept_exactly(tmp_path):
    workload = ("  - label: x\n    arrivals: {kind: poisson, rate: 10}\n    duration_s: 5\n"
                "    prompt: {kind: fixed, value: 50}\n    output: {kind: range_mix, ranges: [[3, 4]], probs: [1.0]}\n")
    spec = load_experiment(experiment_file(tmp_path, workload)).workloads[0].build().sample(np.random.default_rng(0))
    assert len(spec) > 0 and set(spec.num_prompt_tokens.tolist()) == {50}
    assert set(spec.num_output_tokens.tolist()) <= {3, 4}


@pytest.mark.parametrize("bad", [50.7, 50.0, True, "50", 0, -3])
def test_length_distributions_take_only_integer_token_counts(bad):
    with pytest.raises(ValueError, match="whole token counts"):
        Choice((bad,), (1.0,))
    with pytest.raises(ValueError, match="whole token counts"):
        RangeMix(((1, bad) if bad not in (0, -3) else (bad, 5),), (1.0,))
    assert Choice((np.int64(7),), (1.0,)).mean() == 7.0  # numpy integers are integers


# ----------------------------------------------------------------------------------------------------- YAML
@pytest.mark.parametrize(("text", "value"), [("1e9", 1e9), ("2.5e-1", 0.25), ("1E+1", 10.0), ("-3e2", -300.0),
                                             ("1.0", 1.0), ("10", 10), ("1e9x", "1e9x"), ("e9", "e9")])
def test_yaml_reads_exponent_floats_as_numbers(text, value):
    import yaml

    loaded = yaml.load(f"v: {text}", Loader=_yaml_loader())["v"]
    assert loaded == value and type(loaded) is type(value)


def test_rate_1e9_is_a_number_and_a_word_is_a_clear_error(tmp_path):
    workload = ("  - label: x\n    arrivals: {kind: poisson, rate: 1e1}\n    duration_s: 5\n"
                "    prompt: {kind: fixed, value: 5}\n    output: {kind: fixed, value: 5}\n")
    assert load_experiment(experiment_file(tmp_path, workload)).workloads[0].build().arrivals.rate == 10.0
    with pytest.raises(ExperimentError, match="workload 'x': rate must be a finite number > 0, got 'fast'"):
        load_experiment(experiment_file(tmp_path, workload.replace("1e1", "fast")))


def test_an_unknown_arrival_key_names_the_allowed_ones(tmp_path):
    workload = ("  - label: x\n    arrivals: {kind: poisson, rat: 10}\n    duration_s: 5\n"
                "    prompt: {kind: fixed, value: 5}\n    output: {kind: fixed, value: 5}\n")
    with pytest.raises(ExperimentError, match=r"arrivals \(poisson\): expected key\(s\) \['rate'\], got \['rat'\]"):
        load_experiment(experiment_file(tmp_path, workload))


def test_a_folder_is_not_an_experiment_file(tmp_path, capsys):
    rc, err = compare_cli(str(tmp_path), tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and f"{tmp_path} is a folder" in err
    with pytest.raises(ExperimentError, match=f"experiment file {tmp_path} is a folder"):
        load_experiment(tmp_path)


def test_invalid_yaml_is_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\npolicies: [fcfs\n")
    rc, err = compare_cli(str(path), tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "invalid YAML" in err


# ------------------------------------------------------------------------------------------- policy parameters
def test_twp_h0_names_initial_window(tmp_path, capsys):
    rc, err = compare_cli(experiment_file(tmp_path, "  - low\n", policies="[{name: twp, params: {H0: 300}}]"),
                          tmp_path, capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "unknown parameter(s) ['H0'] ('H0' is the paper's symbol for 'initial_window'); valid: [" in err


@pytest.mark.parametrize("name", sorted(n for n, cls in POLICIES.items() if cls.Params is not None))
def test_every_policy_refuses_an_unknown_parameter_listing_the_valid_ones(name):
    import dataclasses

    valid = [f.name for f in dataclasses.fields(POLICIES[name].Params)]
    with pytest.raises(ValueError, match="unknown parameter") as err:
        make_policy(name, no_such_knob=1)
    assert str(err.value).endswith(f"valid: {valid}")
    make_policy(name, **{valid[0]: getattr(POLICIES[name].Params(), valid[0])})  # a valid name still works
