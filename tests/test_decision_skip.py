"""The decision skip: a stateless policy is not asked at iterations where nothing can be admitted, and every
episode stays what it was, iteration for iteration (``servegym.runner.make_env``'s ``skip_idle``)."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.policies import POLICIES, deciding, make_policy
from servegym.runner import IterationLimit, make_env, run_episode, serving_env
from tests.conftest import fixed

STATELESS = sorted(name for name in deciding("admission") if POLICIES[name].stateless)
STATEFUL = sorted(name for name in deciding("admission") if not POLICIES[name].stateless)
LOG_ARRAYS = ("state", "admit_s", "first_token_s", "finish_s", "num_preemptions", "reject_reason", "container",
              "cold_start", "num_generated_at_preemption")


def episode(name: str, workload: str, skip: bool, **kwargs):
    policy = make_policy(name)
    engine = {"length_mode": "predicted"} if policy.uses_output_lengths else {}
    env = make_env(policy, skip_idle=skip, workload=workload, engine=engine, **kwargs)
    calls = []
    act = policy.act
    policy.act = lambda obs: calls.append(1) or act(obs)
    result = run_episode(env, policy, seed=3)
    return env, result, len(calls)


def assert_same_episode(a, b) -> None:
    for name in LOG_ARRAYS:
        np.testing.assert_array_equal(getattr(a.log, name), getattr(b.log, name), err_msg=name)
    np.testing.assert_array_equal(a.log.steps(), b.log.steps())
    assert a.steps == b.steps and a.truncated == b.truncated
    assert a.total_reward == b.total_reward  # summed per iteration, in order: the same float
    assert a.summary.keys() == b.summary.keys()
    for key in a.summary:
        assert a.summary[key] == pytest.approx(b.summary[key], rel=1e-12, nan_ok=True), key


def test_the_registry_splits_stateful_from_stateless_policies() -> None:
    # TWP's ITL filter, flow control's token bucket and the random policy's stream advance on every call.
    assert {"twp", "flow-control", "random"} <= set(STATEFUL)
    assert {"fcfs", "vllm", "sarathi", "mc", "mc-sf", "priority"} <= set(STATELESS)


@pytest.mark.parametrize("name", STATELESS)
@pytest.mark.parametrize("workload", ["medium", "tight-memory"])
def test_stateless_policies_play_the_same_episode_with_fewer_calls(name: str, workload: str) -> None:
    env_plain, plain, plain_calls = episode(name, workload, skip=False)
    env_skip, skipped, skip_calls = episode(name, workload, skip=True)
    assert not serving_env(env_plain).decision_steps and serving_env(env_skip).decision_steps
    assert_same_episode(plain, skipped)
    assert plain_calls == plain.steps  # one call an iteration without the skip
    assert skip_calls < plain_calls  # the skip happened (idle waits and full batches exist on both workloads)


def test_a_serverless_pool_plays_the_same_episode() -> None:
    pool = {"num_containers": 3, "keep_alive_s": 2.0}
    _, plain, _ = episode("serverless-llm", "burst", skip=False, pool=pool)
    _, skipped, calls = episode("serverless-llm", "burst", skip=True, pool=pool)
    assert_same_episode(plain, skipped)
    assert calls < plain.steps


@pytest.mark.parametrize("name", STATEFUL)
def test_stateful_policies_keep_stepping_every_iteration(name: str) -> None:
    env = make_env(make_policy(name), workload="medium")
    assert not serving_env(env).decision_steps and not isinstance(env, IterationLimit)


def test_the_episode_limit_counts_iterations_with_the_skip() -> None:
    # A limit that binds: both runs stop at iteration 700, truncated, with the same log.
    _, plain, _ = episode("fcfs", "medium", skip=False, max_episode_steps=700)
    env, skipped, calls = episode("fcfs", "medium", skip=True, max_episode_steps=700)
    assert isinstance(env, IterationLimit) and env.max_iterations == 700
    assert plain.truncated and skipped.truncated and plain.steps == skipped.steps == 700
    assert_same_episode(plain, skipped)
    assert calls < 700


def test_the_registered_limit_applies_when_none_is_given() -> None:
    env = make_env(make_policy("fcfs"), workload="medium")
    assert isinstance(env, IterationLimit) and env.max_iterations == 20_000


def test_asking_for_one_iteration_a_step_turns_the_skip_off() -> None:
    env = make_env(make_policy("fcfs"), workload="medium", decision_steps=False)
    assert not serving_env(env).decision_steps and not isinstance(env, IterationLimit)


def test_info_counts_sum_over_the_skipped_iterations() -> None:
    # Summed over the episode, each count in info equals the log's own total, so no iteration's count is lost
    # and no column is summed into another's key.
    policy = make_policy("fcfs")
    env = make_env(policy, workload="tight-memory")
    obs, info = env.reset(seed=5)
    sums = {key: 0.0 for key in ("num_decode_tokens", "num_prefill_tokens", "num_finished", "num_preemptions",
                                 "num_admitted", "step_s", "num_arrived")}
    sums["num_arrived"] += info["num_arrived"]
    done, several = False, 0
    while not done:
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        done = terminated or truncated
        several += info["num_iterations"] > 1
        for key in sums:
            sums[key] += info[key]
    log = serving_env(env).cluster.log
    steps = log.steps()
    from servegym.engine import STEP_INDEX

    assert several > 10
    for key in ("num_decode_tokens", "num_prefill_tokens", "num_finished", "num_preemptions", "num_admitted"):
        assert sums[key] == steps[:, STEP_INDEX[key]].sum(), key
    assert sums["step_s"] == pytest.approx(steps[:, STEP_INDEX["dt_s"]].sum(), rel=1e-9)
    assert sums["num_arrived"] == log.num_requests


@pytest.mark.parametrize("env_kwargs", [{"reward": "slo_goodput"}, {"reward": "tokens"}, {"reward_half_life_s": 3.0},
                                        {"max_steps": 450}])
def test_the_engines_own_loop_keeps_every_reward_and_limit(env_kwargs, monkeypatch) -> None:
    # The SLO reward needs each iteration's finished ids, the tokens reward its decode tokens, the discount each
    # iteration's start time, and max_steps the iteration that truncates: all as without the skip.
    from servegym.pool.cluster import Cluster

    ran = []
    skip = Cluster.skip
    monkeypatch.setattr(Cluster, "skip", lambda self, limit: ran.append(steps := skip(self, limit)) or steps)
    _, plain, _ = episode("fcfs", "tight-memory", skip=False, **env_kwargs)
    assert not ran
    _, skipped, _ = episode("fcfs", "tight-memory", skip=True, **env_kwargs)
    assert_same_episode(plain, skipped)
    in_loop = sum(len(run.outcomes) for run in ran if run)
    assert in_loop > 50  # iterations ran in the engine's loop, not through Cluster.step
    assert plain.truncated == ("max_steps" in env_kwargs)


def test_the_engines_loop_stops_where_a_decision_or_an_arrival_is_due(monkeypatch) -> None:
    # One slot: A (10-token prompt, 100 tokens out) runs and B waits behind it. The first step admits A and
    # prefills it (its first token); the engine's loop then decodes until the iteration that finishes A, where a
    # slot frees for B: one step of 100 iterations. A third request C arriving meanwhile breaks the loop after the
    # iteration that ends at or past its arrival, to be routed; the step goes on (nothing can be admitted).
    from servegym.pool.cluster import Cluster

    batches = []
    skip = Cluster.skip
    monkeypatch.setattr(Cluster, "skip", lambda self, limit: batches.append(steps := skip(self, limit)) or steps)

    def run(arrival_c: float, limit: int | None = None):
        batches.clear()
        env = make_env(make_policy("fcfs"), workload=fixed([0.0, 0.0, arrival_c], [10, 10, 10], [100, 5, 5]),
                       engine={"max_num_seqs": 1}, skip_idle=True, max_episode_steps=limit)
        env.reset(seed=0)
        inner = serving_env(env)
        _, _, _, truncated, info = env.step(np.eye(inner.queue_window, dtype=np.int64)[0])
        return inner, info, truncated

    inner, info, _ = run(1e6)
    assert info["num_iterations"] == 100 and info["num_finished"] == 1 and info["num_decode_tokens"] == 100
    assert inner.cluster.engine.can_admit() and inner.num_steps == 100
    assert info["num_stalled_steps"] == 1  # B waits with nothing running after the last iteration, not before
    assert [len(b.outcomes) for b in batches] == [99]  # all after the first in one run of the engine loop
    decode_s = batches[0].outcomes[0].dt_s
    first_s = inner.cluster.log.steps()[0, 1]
    arrival = first_s + 29.5 * decode_s  # during the 31st iteration
    inner, info, _ = run(arrival)
    assert info["num_iterations"] == 100 and info["num_arrived"] == 1
    assert [len(b.outcomes) for b in batches] == [30, 69]  # iterations 2-31, then 32-100 after routing C
    started_s, last = batches[0].started_s[-1], batches[0].last
    assert started_s < arrival <= started_s + last.outcome.dt_s and last.arrived == 1
    inner, info, truncated = run(1e6, limit=40)
    assert info["num_iterations"] == 40 and truncated and [len(b.outcomes) for b in batches] == [39]


def test_a_calibrated_replay_loads_nothing_it_does_not_use() -> None:
    # The calibrated path of a replay: no torch, transformers, matplotlib, SB3, Optuna, nor the frame renderer.
    import subprocess
    import sys

    code = ("import sys; from servegym.policies import make_policy; from servegym.runner import make_env, run_episode;"
            "p = make_policy('fcfs'); run_episode(make_env(p, workload='medium'), p, seed=0);"
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                check=True).stdout.split())
    assert "servegym.pool.cluster" in loaded  # it ran
    unused = {"torch", "transformers", "matplotlib", "stable_baselines3", "optuna", "servegym.envs.render", "tqdm"}
    assert not unused & loaded
