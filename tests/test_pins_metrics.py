"""Pins of metric definitions and env accounting under pools, rejection and truncation, each computed by hand from
its definition on an asymmetric example (so that a slip in any one term changes the number)."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.engine import State, compiled_available
from servegym.engine.log import EpisodeLog, StepRow
from servegym.metrics.core import censored_latency, goodput, makespan, met_slo, summarize
from servegym.policies import make_policy
from servegym.runner import make_env
from tests.conftest import PAPER, fixed

ENGINES = ["python", pytest.param("compiled", marks=pytest.mark.skipif(
    not compiled_available(), reason="the compiled engine is not built here"))]
REL = 1e-12
"""Relative tolerance for hand-computed sums of a few doubles."""


def _row(end_s: float) -> StepRow:
    return StepRow(end_s, 0.5, 1, 0, 0, 1, 0, 1, 0, 0, 0)


def pool_log() -> EpisodeLog:
    """Six requests over two containers, one in each lifecycle bucket that the censored metrics treat apart.

    ===  =======  =========  ====================================
    id   arrival  container  state
    ===  =======  =========  ====================================
    0    1.0      0          finished at 4.0 (first token 2.0)
    1    2.0      1          finished at 9.0 (first token 3.0)
    2    3.0      0          decoding (unfinished, running)
    3    4.0      0          preempted (unfinished, waiting)
    4    5.0      1          rejected (finish stamped at arrival)
    5    6.0      -          pending: never arrived
    ===  =======  =========  ====================================

    Container 0's last iteration ends at 8.0, container 1's (the last container) at 10.0.
    """
    n = 6
    log = EpisodeLog(np.arange(1.0, n + 1), np.full(n, 10), np.full(n, 5), np.ones(n, dtype=np.int64),
                     np.full(n, 5), np.zeros(n, dtype=bool), num_kv_blocks=100, block_size=16, num_containers=2)
    log.state[:] = [State.FINISHED, State.FINISHED, State.DECODING, State.PREEMPTED, State.REJECTED, State.PENDING]
    log.container[:] = [0, 1, 0, 0, 1, -1]
    log.finish_s[[0, 1, 4]] = [4.0, 9.0, 5.0]
    log.first_token_s[[0, 1, 2]] = [2.0, 3.0, 3.5]
    log.step_rows[0] = [_row(3.0), _row(8.0)]
    log.step_rows[1] = [_row(2.5), _row(10.0)]
    return log


def test_makespan_runs_to_the_latest_container_end():
    # Rule: first arrival to the end of the last iteration of ANY container: max(8.0, 10.0) - 1.0.
    assert makespan(pool_log()) == 9.0


def test_censored_latency_counts_arrived_unrejected_requests_to_the_episode_end():
    # Rule: arrived and not rejected (ids 0-3); finished ones to their finish, the rest to the episode's end
    # arrival[0] + makespan = 10.0: [4-1, 9-2, 10-3, 10-4].
    np.testing.assert_array_equal(censored_latency(pool_log()), [3.0, 7.0, 7.0, 6.0])


def test_summary_separates_finished_unfinished_rejected_and_pending():
    out = summarize(pool_log(), ttft_slo_s=1.5, itl_slo_s=10.0)
    assert out["e2e_mean_all_s"] == pytest.approx(23.0 / 4, rel=REL)  # censored mean, not the 5.0 of finished
    assert out["e2e_mean"] == pytest.approx(5.0, rel=REL)
    # Censored [3, 6, 7, 7]: P95 at rank 0.95 x 3 = 2.85 is 7.0; the finished ones alone [3, 7] give 3 + 0.95 x 4.
    assert out["e2e_p95_all_s"] == pytest.approx(7.0, rel=REL)
    assert out["e2e_p95"] == pytest.approx(6.8, rel=REL)
    assert out["num_unfinished"] == 2.0  # one running + one preempted (waiting); not the rejected, not pending
    assert (out["num_arrived"], out["num_rejected"], out["num_finished"]) == (5.0, 1.0, 2.0)
    assert out["makespan_s"] == 9.0
    # TTFTs 1.0 and 1.0 meet 1.5 s; both finished requests are good over a 9 s makespan.
    assert out["goodput_rps"] == pytest.approx(2.0 / 9.0, rel=REL)
    assert out["throughput_rps"] == pytest.approx(2.0 / 9.0, rel=REL)


def test_goodput_counts_only_finished_requests_meeting_both_slos():
    log = pool_log()
    log.first_token_s[1] = 4.5  # request 1's TTFT becomes 2.5 s
    assert goodput(log, ttft_slo_s=2.0, itl_slo_s=10.0) == pytest.approx(1.0 / 9.0, rel=REL)
    # TPOT: (finish - first) / (out - 1) = (4 - 2) / 4 = 0.5 s for request 0, (9 - 4.5) / 4 = 1.125 s for 1.
    np.testing.assert_array_equal(met_slo(log, np.array([0, 1]), 10.0, 0.5), [True, False])


def _episode(engine: str, monkeypatch, reward: str, **kwargs):
    monkeypatch.setenv("SERVEGYM_ENGINE", engine)
    env = make_env(make_policy("fcfs"), profile=PAPER, reward=reward, flat_obs=False, **kwargs)
    obs, _ = env.reset(seed=3)
    policy, rewards, info, done = make_policy("fcfs"), [], {}, False
    policy.reset()
    while not done:
        obs, r, terminated, truncated, info = env.step(policy.act(obs))
        rewards.append(r)
        done = terminated or truncated
    return env.unwrapped, rewards, info, truncated


@pytest.mark.parametrize("engine", ENGINES)
def test_slo_goodput_reward_sums_to_the_good_requests_of_every_container(engine, monkeypatch):
    # Rule: each step's reward is the requests that finished in that step, on the container that ran it, within
    # both SLOs; over an episode it sums to met_slo over every finished request, whichever container served it.
    from servegym.workloads import make_workload

    env, rewards, info, _ = _episode(engine, monkeypatch, "slo_goodput", workload=make_workload("burst"),
                                     pool={"num_containers": 3}, ttft_slo_s=0.5, itl_slo_s=0.06)
    log = env.cluster.log
    finished = np.flatnonzero(log.state == State.FINISHED)
    good = int(np.count_nonzero(met_slo(log, finished, 0.5, 0.06)))
    assert len(set(log.container[finished].tolist())) == 3, "every container finishes requests"
    assert 0 < good < finished.size, "the SLOs split the finished requests"
    assert sum(rewards) == good == info["num_slo_good"]


@pytest.mark.parametrize("engine", ENGINES)
def test_truncation_charges_every_unserved_request_including_those_not_yet_arrived(engine, monkeypatch):
    # Rule: when max_steps truncates, the latency return is minus the censored latency of the arrived requests
    # minus truncation_penalty_s for each request neither finished nor rejected, the not-yet-arrived included.
    arrivals = np.concatenate([np.linspace(0.0, 1.0, 12), [1.0, 400.0, 401.0]])
    prompts = np.concatenate([np.full(12, 200), [10**6, 50, 50]])  # one never fits: rejected on arrival
    workload = fixed(arrivals, prompts, np.full(15, 300))
    env, rewards, _, truncated = _episode(engine, monkeypatch, "latency", workload=workload, max_steps=40,
                                          truncation_penalty_s=7.0)
    log = env.cluster.log
    counts = log.counts()
    pending = log.num_requests - counts["num_arrived"]
    assert truncated and pending == 2 and counts["num_rejected"] == 1 and counts["num_finished"] == 0
    unserved = counts["num_waiting"] + counts["num_running"] + pending  # 12 + 2 here
    assert env.num_unserved == unserved == 14
    expected = -censored_latency(log).sum() - 7.0 * unserved
    assert sum(rewards) == pytest.approx(expected, rel=1e-9)
