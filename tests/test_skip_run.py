"""Bookkeeping of the iterations a decision step runs in the engine's own loop (``Cluster.skip``'s ``SkipRun``,
booked by ``ServingEnv._account_run`` up to its last): what the reward alone does not show, the SLO count in info,
the rejections summed into info and the preemptions the thrash warning counts, each as without the loop; and each
reward's sum, hand-computed, with the loop and without it (one rule books both)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from servegym.engine import STEP_INDEX
from servegym.policies import make_policy
from servegym.runner import make_env, serving_env
from tests.conftest import fixed

LOOSE_SLO = {"ttft_slo_s": 1e9, "itl_slo_s": 1e9}


def first_step(workload, skip: bool, **kwargs):
    env = make_env(make_policy("fcfs"), workload=workload, skip_idle=skip, **kwargs)
    env.reset(seed=0)
    inner = serving_env(env)
    _, _, terminated, _, info = env.step(np.ones(inner.queue_window, dtype=np.int64))
    return inner, info, terminated


@pytest.mark.parametrize("skip", [False, True])
def test_a_finish_inside_the_loop_counts_in_num_slo_good(skip: bool) -> None:
    # Two slots: A (10-token prompt, 20 out) and B (10, 60 out) are admitted together. Nothing waits, so one step
    # runs the whole episode: A finishes in an iteration inside the engine's loop, B in its last. Both meet loose
    # SLOs, so info["num_slo_good"] is 2 (booking only the last iteration's finishes gives 1). Latency reward: the
    # SLO count is not the reward here, only info.
    workload = fixed([0.0, 0.0], [10, 10], [20, 60])
    inner, info, terminated = first_step(workload, skip, engine={"max_num_seqs": 2}, **LOOSE_SLO)
    if not skip:  # one iteration a step; finish the episode stepping with nothing to admit
        env_done = terminated
        while not env_done:
            _, _, terminated, truncated, info = inner.step(np.zeros(inner.queue_window, dtype=np.int64))
            env_done = terminated or truncated
    else:
        assert terminated and info["num_iterations"] == inner.num_steps > 20  # one step, A's finish inside it
    assert info["num_slo_good"] == 2


def test_a_rejection_routed_after_the_loop_is_summed_into_info() -> None:
    # One slot: A (10 prompt, 100 out) runs, B waits behind it; C, whose 10**6-token prompt never fits the KV
    # cache, arrives while A decodes and is rejected when routed after the loop's iteration that reaches it. The
    # step goes on to A's finish: 100 iterations, 1 arrival, 1 rejection, 1 finish, summed over them.
    workload = fixed([0.0, 0.0, 0.3], [10, 10, 10**6], [100, 5, 5])
    inner, info, _ = first_step(workload, True, engine={"max_num_seqs": 1})
    assert info["num_iterations"] == 100
    assert (info["num_arrived"], info["num_rejected"], info["num_finished"]) == (1, 1, 1)
    assert inner.cluster.num_rejected == 1


def test_preemptions_inside_the_loop_count_towards_the_thrash_warning(monkeypatch) -> None:
    # The warning fires once the episode's preemptions exceed THRASH_PREEMPTIONS_PER_REQUEST per request. Set the
    # limit just under the episode's total (read from its own step log): the warning must fire, naming the total.
    # A preemption usually frees a slot and blocks, which ends the engine's loop there; with 300 KV blocks on the
    # burst workload a few happen at iterations inside a loop (all blocks in use again after the eviction), and
    # they count too.
    import servegym.envs.serving as serving
    from servegym.pool.cluster import Cluster

    inside = []
    skip = Cluster.skip

    def recording(self, limit):
        run = skip(self, limit)
        inside.extend(outcome.num_preemptions for outcome in (run.outcomes[:-1] if run else ()))
        return run

    monkeypatch.setattr(Cluster, "skip", recording)

    def run(per_request: float):
        monkeypatch.setattr(serving, "THRASH_PREEMPTIONS_PER_REQUEST", per_request)
        policy = make_policy("fcfs")
        env = make_env(policy, workload="burst", skip_idle=True, engine={"num_kv_blocks": 300})
        obs, _ = env.reset(seed=3)
        done = False
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            while not done:
                obs, _, terminated, truncated, _ = env.step(policy.act(obs))
                done = terminated or truncated
        log = serving_env(env).cluster.log
        thrash = [str(w.message) for w in record if "thrashing" in str(w.message)]
        return thrash, int(log.steps()[:, STEP_INDEX["num_preemptions"]].sum()), log.num_requests

    thrash, total, requests = run(10**9)
    assert not thrash and total > 10 and sum(inside) > 0  # some preemptions fall inside the engine's loop
    thrash, again, _ = run((total - 0.5) / requests)
    assert again == total and len(thrash) == 1 and thrash[0].startswith(f"{total} preemptions")


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize(("reward", "expected"), [("tokens", 80.0), ("slo_goodput", 2.0)])
def test_each_reward_sums_to_its_definition(reward: str, expected: float, skip: bool) -> None:
    # Two slots: A (10-token prompt, 20 out) and B (10, 60 out), admitted at once, never preempted. The tokens
    # reward sums output tokens, 20 + 60 = 80 (prefill tokens, 20, do not count); the SLO goodput reward counts
    # requests that finish within both SLOs, 2 under loose ones; each per iteration or over runs of the
    # engine's loop alike.
    env = make_env(make_policy("fcfs"), workload=fixed([0.0, 0.0], [10, 10], [20, 60]), skip_idle=skip,
                   engine={"max_num_seqs": 2}, reward=reward, **LOOSE_SLO)
    env.reset(seed=0)
    inner = serving_env(env)
    action = np.ones(inner.queue_window, dtype=np.int64)
    total, done = 0.0, False
    while not done:
        _, r, terminated, truncated, _ = env.step(action)
        total += r
        done = terminated or truncated
        action = np.zeros_like(action)
    assert total == expected
