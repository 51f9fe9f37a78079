"""The compiled engine is the Python engine, float for float: the same observations, rewards, infos and logs on
episodes that exercise every branch of the iteration (chunking, token caps, each preemption rule, each length
mode, cold pools, latency noise, a backend that needs the batch's arrays, invariant checks)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from servegym.backends import CalibratedBackend, load_profile
from servegym.engine import compiled
from servegym.engine.compiled import compiled_available, engine_class
from servegym.policies import make_policy
from servegym.runner import make_env
from tests.golden import fingerprint

needs_compiled = pytest.mark.skipif(not compiled_available(), reason="the compiled engine is not built here")


def test_ci_builds_the_compiled_engine():
    # .ci/run sets SERVEGYM_REQUIRE_COMPILED=1: there a missing build fails instead of falling back silently.
    if os.environ.get("SERVEGYM_REQUIRE_COMPILED") == "1":
        assert compiled_available()
        assert engine_class() is compiled.CompiledEngine


class ArraysOnly:
    """A calibrated backend without ``execute_totals``: the compiled engine must build the StepBatch arrays."""

    def __init__(self, profile: str) -> None:
        self.inner = CalibratedBackend(load_profile(profile))
        self.num_kv_blocks, self.block_size = self.inner.num_kv_blocks, self.inner.block_size
        self.baseline_step_s, self.owns_cache = self.inner.baseline_step_s, False
        self.batches: list[tuple] = []

    def reset(self, rng: np.random.Generator) -> None:
        self.inner.reset(rng)
        self.batches = []

    def execute(self, batch) -> float:
        self.batches.append(tuple(np.array(part).tolist() for part in batch))
        return self.cast(self.inner.execute(batch))

    def release(self, request_ids: np.ndarray) -> None:
        pass

    cast = float


class Float32Latency(ArraysOnly):
    """Returns numpy float32 latencies: both engines must still keep their clocks in Python floats."""

    cast = np.float32


class SlowerCalibrated(CalibratedBackend):
    """A calibrated backend whose own ``execute`` adds 10 ms: the inherited ``execute_totals`` must not bypass it."""

    def __init__(self, profile: str) -> None:
        super().__init__(load_profile(profile))
        self.batches: list = []

    def execute(self, batch) -> float:
        self.batches.append(len(batch.decode_ids))
        return super().execute(batch) + 0.010


PROFILE = "paper-v100-llama3.2-3b"
# (policy, params, workload, engine settings, pool settings, env settings, seed, steps)
CASES = {
    "fcfs-chunked": ("fcfs", {}, "burst", {"prefill_chunk_tokens": 48, "max_num_batched_tokens": 256,
                                           "max_num_seqs": 24}, {}, {}, 0, 700),
    "twp-token-cap": ("twp", {"chunking": "total", "prefill_chunk_tokens": 40}, "high", {"num_kv_blocks": 500}, {},
                      {}, 1, 700),
    "lifo-tight": ("fcfs", {}, "burst", {"num_kv_blocks": 160, "length_mode": "known"}, {}, {}, 2, 700),
    "clear-all": ("alpha-protection", {}, "medium", {"num_kv_blocks": 200}, {}, {}, 3, 700),
    "fewest-generated": ("fcfs", {}, "burst", {"num_kv_blocks": 150, "preemption": "fewest_generated"}, {}, {}, 4,
                         700),
    "shortest-predicted": ("amin", {}, "burst", {"num_kv_blocks": 120, "length_mode": "predicted",
                                                 "preemption": "shortest_predicted"}, {}, {}, 5, 700),
    "random-order": ("random", {}, "high", {"num_kv_blocks": 400, "length_mode": "predicted"}, {}, {}, 6, 700),
    "cold-pool": ("priority", {}, "burst", {"num_kv_blocks": 500},
                  {"num_containers": 3, "keep_alive_s": 2.0, "start_cold": True}, {}, 7, 900),
    "noisy-latency": ("vllm", {}, "medium", {"check_invariants": True}, {}, {"latency_noise_cv": 0.2}, 8, 600),
    "sarathi-azure": ("sarathi", {}, "azure", {"num_kv_blocks": 1500}, {}, {}, 9, 900),
    "arrays-backend": ("twp", {"prefill_chunk_tokens": 32}, "burst", {"num_kv_blocks": 300}, {},
                       {"backend": "arrays"}, 10, 500),
    "never-fits": ("fcfs", {}, "azure", {"num_kv_blocks": 100}, {}, {}, 11, 600),
    "float32-backend": ("vllm", {}, "burst", {"num_kv_blocks": 300}, {}, {"backend": Float32Latency}, 12, 400),
    "overridden-execute": ("fcfs", {}, "burst", {}, {}, {"backend": SlowerCalibrated}, 13, 400),
}


def _workload(name: str):
    from tests.golden import _workload as golden_workload

    return golden_workload(name)


def _play(monkeypatch, engine: str, case: tuple) -> tuple[list, object, list]:
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    name, params, workload, engine_cfg, pool, env_kw, seed, steps = case
    policy = make_policy(name, **params)
    env_kw = dict(env_kw)
    backend = None
    if env_kw.get("backend") == "arrays":
        backend = env_kw["backend"] = ArraysOnly(PROFILE)
    elif isinstance(env_kw.get("backend"), type):
        backend = env_kw["backend"] = env_kw["backend"](PROFILE)
    else:
        env_kw["profile"] = PROFILE
    env = make_env(policy, workload=_workload(workload), engine=engine_cfg, pool=pool, max_episode_steps=steps,
                   flat_obs=True, **env_kw)
    assert type(env.unwrapped.cluster.engines[0]) is engine_class(engine)
    obs, info = env.reset(seed=seed)
    policy.reset()
    unflatten = env.unwrapped.dict_observation_space
    trace, done = [(obs.copy(), info)], False
    from gymnasium import spaces

    while not done:
        obs, reward, terminated, truncated, info = env.step(policy.act(spaces.unflatten(unflatten, obs)))
        trace.append((obs.copy(), reward, info, terminated, truncated))
        done = terminated or truncated
    return trace, env.unwrapped.cluster.log, backend.batches if backend is not None else []


@needs_compiled
@pytest.mark.parametrize("label", list(CASES))
def test_compiled_engine_plays_the_python_engines_episode(monkeypatch, label):
    python, python_log, python_batches = _play(monkeypatch, "python", CASES[label])
    fast, fast_log, fast_batches = _play(monkeypatch, "compiled", CASES[label])
    assert len(fast) == len(python)
    for step, (a, b) in enumerate(zip(python, fast, strict=True)):
        np.testing.assert_array_equal(a[0], b[0], err_msg=f"observation at step {step}")
        assert a[1:] == b[1:], f"reward, info or flags at step {step}"
    assert fingerprint(fast_log) == fingerprint(python_log)
    assert fast_batches == python_batches


@needs_compiled
def test_cases_reach_the_branches_they_are_named_for(monkeypatch):
    # Without this, a case could drift (a re-tuned workload) into never preempting or never chunking.
    def preemptions(label):
        _, log, _ = _play(monkeypatch, "compiled", CASES[label])
        return int(log.num_preemptions.sum()), log.steps()

    for label in ("lifo-tight", "clear-all", "fewest-generated", "shortest-predicted"):
        assert preemptions(label)[0] > 0, label
    _, steps = preemptions("fcfs-chunked")
    from servegym.engine import STEP_INDEX, State

    assert steps[:, STEP_INDEX["num_prefill_seqs"]].max() > 1  # several prompts share one iteration's budget
    assert len(_play(monkeypatch, "compiled", CASES["arrays-backend"])[2]) > 0
    trace, log, batches = _play(monkeypatch, "compiled", CASES["overridden-execute"])
    assert len(batches) == len(log.steps()) - np.count_nonzero(log.steps()[:, 2:5].sum(axis=1) == 0)
    trace, _, _ = _play(monkeypatch, "compiled", CASES["float32-backend"])
    assert all(type(step[2]["clock_s"]) is float for step in trace[1:])
    _, log, _ = _play(monkeypatch, "compiled", CASES["never-fits"])
    rejected = log.state == State.REJECTED
    assert 0 < rejected.sum() < log.num_requests * 0.9  # some requests refused on arrival, most served


def test_engine_choice_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="engine must be one of"):
        engine_class("fast")
    monkeypatch.setenv("SERVEGYM_ENGINE", "cython")
    with pytest.raises(ValueError, match="SERVEGYM_ENGINE"):
        engine_class()
    monkeypatch.setattr(compiled, "CompiledEngine", None)
    assert engine_class("auto") is compiled.Engine  # falls back when not built
    with pytest.raises(ImportError, match="not built"):
        engine_class("compiled")


@needs_compiled
def test_compiled_engine_refuses_to_step_without_an_episode():
    from servegym.engine import EngineConfig

    engine = compiled.CompiledEngine(EngineConfig(), CalibratedBackend(load_profile(PROFILE)))
    with pytest.raises(RuntimeError, match="reset"):
        engine.step(np.zeros(0, dtype=np.int64))


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=needs_compiled)])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_env_continues_exactly_as_the_original(monkeypatch, engine, how):
    # Search and snapshot code copies envs mid-episode: the copy must be independent and play on identically
    # (the compiled engine's typed views are rebound on the copy, the encoder's template is not shared).
    import copy
    import pickle

    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    env = make_env(make_policy("fcfs"), workload=_workload("burst"), profile=PROFILE, flat_obs=True,
                   engine={"num_kv_blocks": 300})
    env.reset(seed=0)
    admit_all = np.ones(32, dtype=np.int64)
    for _ in range(60):
        env.step(admit_all)
    twin = copy.deepcopy(env) if how == "deepcopy" else pickle.loads(pickle.dumps(env))
    assert type(twin.unwrapped.cluster.engine) is engine_class(engine)
    for step in range(200):
        a, b = env.step(admit_all), twin.step(admit_all)
        np.testing.assert_array_equal(a[0], b[0], err_msg=f"step {step}")
        assert a[1:] == b[1:]
    assert fingerprint(twin.unwrapped.cluster.log) == fingerprint(env.unwrapped.cluster.log)
    assert twin.unwrapped.cluster.log.state is not env.unwrapped.cluster.log.state


@needs_compiled
def test_compiled_engine_checks_the_indexes_it_does_not_bound_check(monkeypatch):
    # The compiled loops skip bounds checks: an out-of-range queue position, request id or a short observation
    # buffer must be a clear error, not a read past an array.
    monkeypatch.setenv("SERVEGYM_ENGINE", "compiled")
    env = make_env(make_policy("fcfs"), workload=_workload("burst"), profile=PROFILE)
    env.reset(seed=0)
    engine = env.unwrapped.cluster.engine
    queued = engine.waiting.size
    with pytest.raises(IndexError, match="queue position"):
        engine.step(np.array([queued], dtype=np.int64))
    with pytest.raises(IndexError, match="request id"):
        engine.receive(np.array([env.unwrapped.cluster.log.num_requests], dtype=np.int64), engine.clock)
    with pytest.raises(ValueError, match="does not fit"):
        engine.observe(np.zeros(10, dtype=np.float32), 17, 200, 32, 0.0, 1.0, 0.0)
    big = np.zeros(2000, dtype=np.float32)
    with pytest.raises(ValueError, match="does not fit"):  # negative offsets would write before the buffer
        engine.observe(big[1000:], 17, -40, -10, 0.0, 1.0, 0.0)
    with pytest.raises(IndexError, match="running rows"):
        engine._remove_rows(np.arange(5000) + 1000)


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=needs_compiled)])
def test_both_engines_refuse_queue_positions_outside_the_contract(monkeypatch, engine):
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    env = make_env(make_policy("fcfs"), workload=_workload("burst"), profile=PROFILE)
    env.reset(seed=0)
    core = env.unwrapped.cluster.engine
    while core.waiting.size < 3:
        env.step(np.zeros(32, dtype=np.int64))
    for bad, message in ((np.array([-1]), "out of range"), (np.array([1.9]), "integers"), ([True], "integers")):
        with pytest.raises(IndexError, match=message):
            core.step(bad)
    out = core.step(np.array([2, 0]))  # distinct, in range, any order: admitted as given
    assert out.num_admitted == 2


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=needs_compiled)])
@pytest.mark.parametrize("latency", [0.0, -1.0, float("nan"), float("inf")])
def test_both_engines_reject_an_invalid_step_latency(monkeypatch, engine, latency):
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    backend = ArraysOnly(PROFILE)
    backend.execute = lambda batch: latency
    env = make_env(make_policy("fcfs"), workload=_workload("burst"), backend=backend)
    obs, _ = env.reset(seed=0)
    with pytest.raises(RuntimeError, match="invalid step latency"):
        for _ in range(50):
            obs, *_ = env.step(make_policy("fcfs").act(obs))
