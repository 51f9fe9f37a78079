"""Every kind of bad input gets a clear error (or a documented, counted rejection) and loses nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servegym.backends import ProfileError, load_profile
from servegym.engine import EngineConfig
from servegym.policies import make_policy
from servegym.workloads import RequestSpec, TraceError, TraceWorkload
from tests.conftest import admit_all, fixed, make


@pytest.fixture
def env():
    env = make(fixed([0.0, 0.0, 0.0], [10, 10, 10], [5, 5, 5]))
    env.reset(seed=0)
    return env


@pytest.mark.parametrize(
    ("action", "error", "match"),
    [
        (np.ones(5, dtype=np.int64), ValueError, "shape"),
        (np.ones((32, 1), dtype=np.int64), ValueError, "shape"),
        (np.ones(32, dtype=np.float32), TypeError, "integer"),
        (np.full(32, np.nan), ValueError, "NaN"),
        (np.full(32, 33, dtype=np.int64), ValueError, r"\[0, 32\]"),
        (np.full(32, -1, dtype=np.int64), ValueError, r"\[0, 32\]"),
    ],
)
def test_invalid_actions_raise_and_change_nothing(env, action, error, match):
    before = env.unwrapped.engine.waiting.copy()
    with pytest.raises(error, match=match):
        env.step(action)
    assert env.unwrapped.engine.waiting.tolist() == before.tolist()
    assert env.unwrapped.engine.step_index == 0


def test_admitting_an_empty_slot_is_counted_or_refused():
    lenient = make(fixed([0.0], [10], [5]))
    lenient.reset(seed=0)
    _, _, _, _, info = lenient.step(admit_all(lenient))  # slot 0 is real, slots 1..31 are empty
    assert info["num_invalid_admissions"] == 31 and info["num_admitted"] == 1
    strict = make(fixed([0.0], [10], [5]), strict_actions=True)
    strict.reset(seed=0)
    with pytest.raises(ValueError, match="empty queue slot"):
        strict.step(admit_all(strict))
    assert strict.unwrapped.engine.waiting.size == 1



def _admitted_in_order(ranks: dict[int, int]) -> tuple[list[int], dict]:
    """The running requests' ids, in activation order, after one step whose action gives ``ranks`` (slot: rank) to
    three waiting requests (ids 0, 1, 2 in queue order)."""
    env = make(fixed([0.0, 0.0, 0.0], [10, 20, 30], [5, 5, 5]))
    env.reset(seed=0)
    action = np.zeros(env.unwrapped.queue_window, dtype=np.int64)
    action[list(ranks)] = list(ranks.values())
    _, _, _, _, info = env.step(action)
    return env.unwrapped.engine.running_ids.tolist(), info


@pytest.mark.parametrize(
    ("ranks", "order"),
    [
        ({0: 3, 1: 1, 2: 2, 4: 1}, [1, 2, 0]),  # by rank; the empty slot 4 is counted and dropped
        ({0: 2, 1: 1, 2: 2}, [1, 0, 2]),  # a tie keeps queue order
        ({0: 2, 1: 2, 2: 2, 4: 2}, [0, 1, 2]),  # all tied: queue order
    ],
)
def test_ranked_admission_orders_by_rank_and_drops_empty_slots(ranks, order):
    admitted, info = _admitted_in_order(ranks)
    assert admitted == order
    assert info["num_invalid_admissions"] == sum(slot >= 3 for slot in ranks) and info["num_admitted"] == 3


@pytest.mark.parametrize(
    ("arrival", "prompt", "output", "match"),
    [
        ([0.0], [0], [5], "num_prompt_tokens must be >= 1"),
        ([0.0], [10], [-3], "num_output_tokens must be >= 1"),
        ([0.0], [10.5], [5], "whole numbers"),
        ([0.0], [np.nan], [5], "whole numbers"),
        ([np.nan], [10], [5], "finite"),
        ([1.0, 0.5], [10, 10], [5, 5], "sorted"),
        ([-1.0], [10], [5], ">= 0"),
        ([0.0, 1.0], [10], [5], "equal length"),
    ],
)
def test_bad_request_specs(arrival, prompt, output, match):
    with pytest.raises(ValueError, match=match):
        RequestSpec(np.asarray(arrival), np.asarray(prompt), np.asarray(output))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"block_size": 0}, "block_size must be a positive int"),
        ({"num_kv_blocks": -5}, "num_kv_blocks must be a positive int"),
        ({"prefill_chunk_tokens": 4096, "max_num_batched_tokens": 2048}, "exceeds max_num_batched_tokens"),
        ({"max_num_batched_tokens": 64, "max_num_seqs": 128, "prefill_chunk_tokens": 64}, "must be >= max_num_seqs"),
        ({"preemption": "random"}, "random"),
        ({"length_mode": "psychic"}, "psychic"),
        ({"prediction_error": 1.5}, "prediction_error"),
        ({"max_num_seqs": 2.5}, "max_num_seqs must be a positive int"),
        ({"idle_tick_s": 0.0}, "idle_tick_s"),
    ],
)
def test_impossible_engine_configs(fields, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**fields)


def test_unknown_engine_field_in_env_kwargs():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \[.blok_size.\]"):
        make(engine={"blok_size": 16})


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"reward": "vibes"}, "unknown reward"), ({"workload": "nope"}, "unknown workload"),
                          ({"queue_window": 0}, "queue_window"), ({"profile": "no-such-profile"}, "unknown profile")],
)
def test_bad_env_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def write_profile(tmp_path, mutate):
    data = load_profile("paper-v100-llama3.2-3b").to_json()
    mutate(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d["latency"].update(l_minn_s=0.04), r"latency: unknown key\(s\) \['l_minn_s'\]"),
        (lambda d: d.update(colour="blue"), r"unknown key\(s\) \['colour'\]"),
        (lambda d: d["latency"].pop("alpha_s"), r"missing key\(s\) \['alpha_s'\]"),
        (lambda d: d["latency"].update(alpha_s=-1.0), "alpha_s must be >= 0"),
        (lambda d: d["latency"].update(l_min_s="fast"), "l_min_s must be a finite number"),
        (lambda d: d["kv_cache"].update(block_size=0), "block_size must be a positive int"),
        (lambda d: d.update(schema_version=99), "schema_version 99 unsupported"),
        (lambda d: d["provenance"].pop("hardware"), "provenance"),
    ],
)
def test_bad_profiles_name_the_file_and_key(tmp_path, mutate, match):
    path = write_profile(tmp_path, mutate)
    with pytest.raises(ProfileError, match=match) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_profile_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "name": "x",\n  oops\n}')
    with pytest.raises(ProfileError, match="line 3"):
        load_profile(path)


def test_profile_round_trips(tmp_path):
    profile = load_profile("paper-v100-llama3.2-3b")
    profile.save(tmp_path / "copy.json")
    assert load_profile(tmp_path / "copy.json") == profile


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("", "line 1: empty file"),
        ("time,prompt,output\n", "line 1: header"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,5\nyesterday,10,5\n", "line 3"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,ten,5\n", "line 2: ContextTokens 'ten'"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,0\n", "line 2: GeneratedTokens must be"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10\n", "line 2: expected 3 columns"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04,10,5\n2023-11-16 18:17:03,10,5\n",
         "line 3: TIMESTAMP goes back"),
    ],
)
def test_bad_trace_files_name_file_line_and_problem(tmp_path, body, match):
    path = tmp_path / "trace.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=match) as err:
        TraceWorkload(str(path)).sample(np.random.default_rng(0))
    assert str(path.resolve()) in str(err.value) or str(path) in str(err.value)


def _rate(v):
    from servegym.workloads import Poisson

    return Poisson(v)


def _cold_start_scale(v):
    from servegym.pool import PoolConfig

    return PoolConfig(cold_start_scale=v)


def _max_num_seqs(v):
    from servegym.engine import EngineConfig

    return EngineConfig(max_num_seqs=v)


def _twp_window(v):
    return make_policy("twp", initial_window=v)


def _vllm_seqs(v):
    return make_policy("vllm", max_num_seqs=v)


@pytest.mark.parametrize("bad", [True, float("nan"), float("inf"), "3", -1, 0])
@pytest.mark.parametrize(("build", "field"), [(_rate, "rate"), (_cold_start_scale, "cold_start_scale"),
                                              (_max_num_seqs, "max_num_seqs"), (_twp_window, "initial_window"),
                                              (_vllm_seqs, "max_num_seqs")])
def test_every_config_rejects_bools_nan_strings_and_non_positive_values_alike(build, field, bad):
    # One set of validators: a bool is not a number, NaN and inf are not finite, and the error names the field.
    with pytest.raises(ValueError, match=field):
        build(bad)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("allreduce_s", 0.0015, r"latency.allreduce_s must be a list of finite numbers, got 0.0015"),
    ("linear_s", "x", r"latency.linear_s must be a list of finite numbers, got 'x'"),
    ("cpu_s", [[0.001, 0.002]], r"latency.cpu_s must be a list of finite numbers, got \[\[0.001, 0.002\]\]"),
    ("cpu_s", [float("nan")], r"latency.cpu_s must be a list of finite numbers"),
    ("linear_s", [True], r"latency.linear_s must be a list of finite numbers"),
])
def test_a_schema_2_table_given_as_anything_but_a_list_of_numbers_is_one_clear_error(tmp_path, key, value, match):
    # A bare number where a table belongs used to raise TypeError ("object of type 'float' has no len()") from
    # inside gym.make; the profile now names the file and the key.
    data = load_profile("a100-llama3-8b").to_json()
    data["latency"][key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=match) as err:
        load_profile(path)
    assert str(path) in str(err.value)
