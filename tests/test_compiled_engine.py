"""The compiled engine is its own source run as Python (the interpreted engine), float for float: the same
observations, rewards, infos and logs on episodes that exercise every branch of the iteration (chunking, token caps,
each preemption rule, each length mode, cold pools, latency noise, a backend that needs the batch's arrays,
invariant checks, recomputed admissions, total prefill caps, exact finish boundaries, partial KV blocks, receive on
an idle engine, a queue longer than the observation window, both signs of the KV-rate EMA), on the old paper profile
and on the default schema-2 profile that ``gym.make`` and ``compare`` use."""

from __future__ import annotations

import os

import numpy as np
import pytest

from servegym.backends import DEFAULT_PROFILE, CalibratedBackend, load_profile
from servegym.engine import compiled
from servegym.engine.compiled import compiled_available, engine_class
from servegym.policies import make_policy
from servegym.runner import make_env
from servegym.workloads import FixedWorkload, RequestSpec
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
PROFILES = (PROFILE, DEFAULT_PROFILE)
"""Every equivalence case runs on the paper profile (schema 1) and on the default profile (schema 2)."""
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
                                                 "preemption": "shortest_predicted"}, {}, {}, 6, 700),
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
    # Preempted requests admitted again out of queue order: admission adds output_hi - generated to the token load.
    "recomputed-admission": ("priority", {}, "burst", {"num_kv_blocks": 150, "length_mode": "known"}, {}, {}, 14,
                             900),
    # A total prefill cap below the batch budget: several prompts share 300 tokens, the last one's chunk cut.
    "prefill-cap": ("fcfs", {}, "azure", {"max_prefill_tokens": 300, "prefill_chunk_tokens": 128,
                                          "num_kv_blocks": 2000}, {}, {}, 15, 900),
    # Prompts and outputs at block boundaries +-1 (one-token outputs finish as they start decoding), a tiny cache.
    "boundaries": ("fcfs", {}, "boundaries", {"block_size": 16, "num_kv_blocks": 30, "prefill_chunk_tokens": 16,
                                              "max_num_batched_tokens": 64, "max_num_seqs": 24,
                                              "length_mode": "known"}, {}, {}, 16, 900),
    # Odd block size: rows hold partial blocks when they finish or are preempted.
    "odd-blocks": ("fcfs", {}, "burst", {"block_size": 7, "num_kv_blocks": 500, "prefill_chunk_tokens": 20}, {}, {},
                   17, 700),
    # Far more waiting than the window shows: the observation counts them all, the window shows 32.
    "long-queue": ("flow-control", {"activation_budget": 0.3}, "high", {}, {}, {}, 18, 600),
    # Sparse arrivals routed in rotation: a container idle behind the pool clock receives and catches up.
    "idle-receive": ("fcfs", {}, "sparse", {}, {"num_containers": 2, "keep_alive_s": 1000.0,
                                               "router": "round_robin"}, {}, 19, 600),
}


def _boundaries(speedup: float) -> FixedWorkload:
    """Groups of five simultaneous arrivals; prompts and outputs cycle through 1 and multiples of 16 +-1."""
    n = 60
    prompts = np.resize([1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65], n)
    outputs = np.resize([1, 2, 15, 16, 17, 31, 32, 33], n)
    arrivals = np.repeat(np.arange(n // 5) * 0.3, 5) / speedup
    return FixedWorkload(RequestSpec(arrivals, prompts, outputs))


def _sparse(speedup: float) -> FixedWorkload:
    """Pairs of requests several seconds apart: every container goes idle between them."""
    n = 24
    arrivals = (np.repeat(np.arange(n // 2) * 4.0, 2) + np.tile([0.0, 0.01], n // 2)) / speedup
    return FixedWorkload(RequestSpec(arrivals, np.resize([20, 300, 47, 129], n), np.resize([5, 40, 16, 1], n)))


def _workload(name: str, profile: str = PROFILE):
    """The golden workloads and two hand-made ones, arriving as fast as ``tests.golden`` runs them on ``profile``."""
    from tests.golden import SPEEDUP
    from tests.golden import _workload as golden_workload

    speedup = SPEEDUP[profile]
    return {"boundaries": _boundaries, "sparse": _sparse}.get(name, lambda s: golden_workload(name, s))(speedup)


def _play(monkeypatch, engine: str, case: tuple, profile: str = PROFILE, env_hook=None) -> tuple[list, object, list]:
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    name, params, workload, engine_cfg, pool, env_kw, seed, steps = case
    policy = make_policy(name, **params)
    env_kw = dict(env_kw)
    backend = None
    if env_kw.get("backend") == "arrays":
        backend = env_kw["backend"] = ArraysOnly(profile)
    elif isinstance(env_kw.get("backend"), type):
        backend = env_kw["backend"] = env_kw["backend"](profile)
    else:
        env_kw["profile"] = profile
    env = make_env(policy, workload=_workload(workload, profile), engine=engine_cfg, pool=pool, max_episode_steps=steps,
                   flat_obs=True, **env_kw)
    assert type(env.unwrapped.cluster.engines[0]) is engine_class(engine)
    if env_hook is not None:
        env_hook(env)
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
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("label", list(CASES))
def test_compiled_engine_plays_the_python_engines_episode(monkeypatch, label, profile):
    python, python_log, python_batches = _play(monkeypatch, "python", CASES[label], profile)
    fast, fast_log, fast_batches = _play(monkeypatch, "compiled", CASES[label], profile)
    assert len(fast) == len(python)
    for step, (a, b) in enumerate(zip(python, fast, strict=True)):
        np.testing.assert_array_equal(a[0], b[0], err_msg=f"observation at step {step}")
        assert a[1:] == b[1:], f"reward, info or flags at step {step}"
    assert fingerprint(fast_log) == fingerprint(python_log)
    assert fast_batches == python_batches


@needs_compiled
@pytest.mark.parametrize("profile", PROFILES)
def test_cases_reach_the_branches_they_are_named_for(monkeypatch, profile):
    # Without this, a case could drift (a re-tuned workload) into never preempting or never chunking.
    from servegym.engine import STEP_INDEX, State

    def play(label, hook=None):
        return _play(monkeypatch, "compiled", CASES[label], profile, hook)

    for label in ("lifo-tight", "clear-all", "fewest-generated", "shortest-predicted", "boundaries", "odd-blocks"):
        assert play(label)[1].num_preemptions.sum() > 0, label
    steps = play("fcfs-chunked")[1].steps()
    assert steps[:, STEP_INDEX["num_prefill_seqs"]].max() > 1  # several prompts share one iteration's budget
    assert len(play("arrays-backend")[2]) > 0
    trace, log, batches = play("overridden-execute")
    assert len(batches) == len(log.steps()) - np.count_nonzero(log.steps()[:, 2:5].sum(axis=1) == 0)
    trace, _, _ = play("float32-backend")
    assert all(type(step[2]["clock_s"]) is float for step in trace[1:])
    log = play("never-fits")[1]
    rejected = log.state == State.REJECTED
    assert 0 < rejected.sum() < log.num_requests * 0.9  # some requests refused on arrival, most served
    _assert_new_cases_reach_their_branches(play, profile)


def _assert_new_cases_reach_their_branches(play, profile: str) -> None:
    from servegym.engine import STEP_INDEX, State

    log = play("recomputed-admission")[1]
    readmitted = (log.num_generated_at_preemption > 0) & (log.state == State.FINISHED)
    assert readmitted.any(), "a request preempted after generating tokens is admitted again and finishes"
    steps = play("prefill-cap")[1].steps()
    assert steps[:, STEP_INDEX["num_prefill_tokens"]].max() == 300  # the cap binds, never exceeded
    assert steps[steps[:, STEP_INDEX["num_prefill_tokens"]] == 300, STEP_INDEX["num_prefill_seqs"]].max() >= 3
    log = play("boundaries")[1]
    one_token = (log.num_output_tokens == 1) & (log.state == State.FINISHED)
    assert one_token.any() and np.all(log.finish_s[one_token] == log.first_token_s[one_token])
    assert log.steps()[:, STEP_INDEX["num_finished"]].max() >= 2  # several finish in one iteration
    trace = play("long-queue")[0]
    waiting = np.array([step[0][6] for step in trace])  # obs["engine"]["num_waiting"]: flat index 6
    assert waiting.max() > 32, f"{profile}: the queue never outgrew the window"
    kv_rate = np.array([step[0][8] for step in play("lifo-tight")[0]])  # obs["engine"]["kv_free_delta"]
    assert kv_rate.min() < 0 < kv_rate.max(), "the KV-rate EMA takes both signs"
    behind = []

    def spy(env):
        for engine in env.unwrapped.cluster.engines:
            def receive(ids, now, engine=engine, inner=engine.receive):
                behind.append(engine.clock < now and not engine.has_work)
                return inner(ids, now)
            engine.receive = receive

    play("idle-receive", spy)
    assert any(behind), "an idle container behind the pool clock receives requests"


def test_engine_choice_is_checked(monkeypatch):
    from servegym.engine import EngineConfig

    with pytest.raises(ValueError, match="engine must be one of"):
        engine_class("fast")
    monkeypatch.setenv("SERVEGYM_ENGINE", "cython")
    with pytest.raises(ValueError, match="SERVEGYM_ENGINE"):
        engine_class()
    monkeypatch.setattr(compiled, "CompiledEngine", None)
    assert engine_class("auto") is compiled.interpreted_engine()  # falls back when not built
    assert not engine_class("auto")(EngineConfig(), CalibratedBackend(load_profile(PROFILE))).__module__.endswith(
        "engine.engine") or not compiled_available()
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


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=needs_compiled)])
def test_a_pickled_env_plays_on_in_a_fresh_process(monkeypatch, tmp_path, engine):
    # A worker process unpickles envs made elsewhere: the interpreted engine's class must import there too.
    import pickle
    import subprocess
    import sys

    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    env = make_env(make_policy("fcfs"), workload=_workload("burst"), profile=PROFILE, flat_obs=True)
    env.reset(seed=0)
    admit_all = np.ones(32, dtype=np.int64)
    for _ in range(30):
        env.step(admit_all)
    (tmp_path / "env.pkl").write_bytes(pickle.dumps(env))
    for _ in range(50):
        env.step(admit_all)
    code = ("import pickle, sys, numpy as np; env = pickle.load(open(sys.argv[1], 'rb')); "
            "[env.step(np.ones(32, dtype=np.int64)) for _ in range(50)]; "
            "print(type(env.unwrapped.cluster.engine).__module__, env.unwrapped.cluster.time)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "env.pkl")], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[0] == type(env.unwrapped.cluster.engine).__module__
    assert float(out[1]) == env.unwrapped.cluster.time  # the same 50 steps in the other process


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


def _three_waiting(monkeypatch, engine: str):
    """The engine (``engine``: python or compiled) of an FCFS env on ``burst`` once three requests wait."""
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    env = make_env(make_policy("fcfs"), workload=_workload("burst"), profile=PROFILE)
    env.reset(seed=0)
    core = env.unwrapped.cluster.engine
    while core.waiting.size < 3:
        env.step(np.zeros(32, dtype=np.int64))
    return core


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=needs_compiled)])
def test_both_engines_refuse_queue_positions_outside_the_contract(monkeypatch, engine):
    core = _three_waiting(monkeypatch, engine)
    for bad, message in ((np.array([-1]), "out of range"), (np.array([1.9]), "integers"), ([True], "integers")):
        with pytest.raises(IndexError, match=message):
            core.step(bad)
    out = core.step(np.array([2, 0]))  # distinct, in range, any order: admitted as given
    assert out.num_admitted == 2


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=needs_compiled)])
@pytest.mark.parametrize("bad", [[1, 0, 1], [0, 2, 2], [0, 1, 99]])
def test_both_engines_refuse_repeated_or_late_bad_positions_before_admitting_any(monkeypatch, engine, bad):
    # A repeated position would admit one request twice (and [0, 2, 2] once passed as a queue head of 3); an
    # out-of-range one after valid ones used to leave those admitted: each is refused before anything changes.
    core = _three_waiting(monkeypatch, engine)
    waiting, running, step = core.waiting.copy(), core.num_running, core.step_index
    with pytest.raises(IndexError, match="given twice" if len(set(bad)) < 3 else "out of range"):
        core.step(np.array(bad))
    assert np.array_equal(core.waiting, waiting) and core.num_running == running and core.step_index == step
    out = core.step(np.array([2, 0]))  # the queue is intact: the same admission as above
    assert out.num_admitted == 2 and np.array_equal(core.waiting, np.delete(waiting, [0, 2]))


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
