"""Two engine-side behaviours by hand (issue 48, item 9): the inter-token-latency features across iterations that
decode nothing (prefill only), and how many decisions a serverless pool asks for under the decision skip.
"""

from __future__ import annotations

import numpy as np
import pytest

from servegym.envs import ENGINE_INDEX
from servegym.envs.observation import POOL_FEATURES, POOL_INDEX
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode, serving_env
from tests.conftest import fixed, flat_profile

# ---------------------------------------------------------------------------------------------- ITL features

L, PER_TOKEN = 0.043, 0.001
"""The profile: l_min 43 ms a step plus 1 ms per prompt token ingested."""


def itl(obs) -> tuple[float, float]:
    return float(obs["engine"][ENGINE_INDEX["itl_last_s"]]), float(obs["engine"][ENGINE_INDEX["itl_smoothed_s"]])


def test_itl_features_move_only_on_iterations_that_decode():
    # A (10-token prompt, 3 tokens out) and B (200-token prompt, 2 out), 64-token chunks. The ITL is the latency of
    # the last iteration that decoded (a request already past its prefill emitted a token); its EMA (weight 0.2)
    # starts at l_min. An iteration that only ingests prompts, or completes a prefill (its first token is not an
    # inter-token gap), leaves both as they were. Latencies: 0.043 + 0.001 x prefill tokens.
    env = make_env(workload=fixed([0.0, 0.0], [10, 200], [3, 2]), profile=flat_profile(prefill_s_per_token=PER_TOKEN),
                   engine={"prefill_chunk_tokens": 64}, queue_window=4)
    obs, _ = env.reset(seed=0)
    assert itl(obs) == pytest.approx((0.0, L), abs=1e-7)
    head, wait = np.eye(4, dtype=np.int64)[0], np.zeros(4, dtype=np.int64)
    s2 = L + 0.2 * (0.107 - L)  # 0.0558
    s3 = s2 + 0.2 * (0.107 - s2)  # 0.06604
    expected = [
        (head, 0.053, (0.0, L)),  # A's whole prompt and first token: prefill only, unchanged
        (head, 0.107, (0.107, s2)),  # A decodes, B ingests 64: decoded, the whole step's latency counts
        (wait, 0.107, (0.107, s3)),  # A's last token, B 64 more
        (wait, 0.107, (0.107, s3)),  # B 64 more, nothing decodes: unchanged
        (wait, 0.051, (0.107, s3)),  # B's last 8 and its first token: unchanged
        (wait, L, (L, s3 + 0.2 * (L - s3))),  # B's second token: a decode step of l_min
    ]
    for i, (action, dt, features) in enumerate(expected):
        obs, _, terminated, _, info = env.step(action)
        assert info["step_s"] == pytest.approx(dt, rel=1e-9), i
        assert itl(obs) == pytest.approx(features, abs=1e-7), i  # float32 observation
        assert terminated == (i == len(expected) - 1)


# ---------------------------------------------------------------------------------------------- pool decisions


def play(skip: bool):
    """fcfs on two containers (one sequence each, round-robin routing, discrete time: 1 s an iteration). Three
    requests at 0 (2, 4 and 1 tokens out) go to containers 0, 1, 0. Returns (deciding container, iterations,
    reward) per env step, the episode's log and its return."""
    policy = make_policy("fcfs")
    env = make_env(policy, skip_idle=skip, workload=fixed([0.0, 0.0, 0.0], [4, 4, 4], [2, 4, 1]),
                   profile="discrete-time", engine={"max_num_seqs": 1},
                   pool={"num_containers": 2, "router": "round_robin"})
    obs, _ = env.reset(seed=0)
    steps, done = [], False
    while not done:
        deciding = int(np.argmax(obs["pool"].reshape(-1, len(POOL_FEATURES))[:, POOL_INDEX["deciding"]]))
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        steps.append((deciding, info["num_iterations"], reward))
        done = terminated or truncated
    return steps, serving_env(env).cluster.log


def test_a_pool_under_the_skip_asks_only_where_the_deciding_container_can_admit():
    # The deciding container is the one with work whose clock is earliest (ties: the lower index).
    #   1. c0 (clocks 0, 0) admits request 0: its prefill and first token, c0 at 1. Next c1 (clock 0) can admit
    #      request 1: the step ends after 1 iteration; the pool clock stays 0, so the reward is 0.
    #   2. c1 admits request 1 (c1 at 1). c0 (at 1, first on the tie) has request 2 waiting but no free slot: no
    #      decision. c0 decodes, request 0 finishes (c0 at 2); c1 decodes (at 2); c0 (tie) now has a free slot and
    #      request 2 waiting: the step ends after 3 iterations. Reward: 3 requests in the system over 2 s, -6.
    #   3. c0 admits request 2, which finishes with its first token (c0 at 3, idle). c1, the only one with work,
    #      decodes twice (at 3, at 4): request 1 finishes and the episode ends. Reward: 2 requests (1, 2) from 2
    #      to 3 s, then 1 to 4 s: -3.
    skipped, log = play(skip=True)
    assert skipped == [(0, 1, 0.0), (1, 3, -6.0), (0, 3, -3.0)]
    # Without the skip: one decision per iteration, seven in all, and the very same iterations.
    plain, plain_log = play(skip=False)
    assert [deciding for deciding, _, _ in plain] == [0, 1, 0, 1, 0, 1, 1]
    assert all(n == 1 for _, n, _ in plain) and sum(r for _, _, r in plain) == -9.0
    np.testing.assert_array_equal(log.steps(), plain_log.steps())
    assert log.container.tolist() == [0, 1, 0] and log.finish_s.tolist() == [2.0, 4.0, 3.0]


def test_the_policy_is_called_once_per_decision():
    # run_episode asks the policy at each env step: three calls with the skip, seven without.
    calls = {}
    for skip in (True, False):
        policy = make_policy("fcfs")
        act, count = policy.act, []
        policy.act = lambda obs, act=act, count=count: count.append(1) or act(obs)
        env = make_env(policy, skip_idle=skip, workload=fixed([0.0, 0.0, 0.0], [4, 4, 4], [2, 4, 1]),
                       profile="discrete-time", engine={"max_num_seqs": 1},
                       pool={"num_containers": 2, "router": "round_robin"})
        result = run_episode(env, policy, seed=0)
        calls[skip] = (len(count), result.steps)
    assert calls == {True: (3, 7), False: (7, 7)}
