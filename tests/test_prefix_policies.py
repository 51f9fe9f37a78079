"""Policies that read the prefix cache, on a queue where it changes their decision: request B (24 tokens, nothing
cached) waits ahead of C (17 tokens, 16 of them cached by an earlier request A). FCFS admits B first; the
prefix-aware rules see that C costs 1 token of prefill."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.policies import make_policy
from servegym.policies.scorer import scores
from servegym.runner import make_env
from tests.test_prefix_caching import backend, workload

QUEUE = workload([0.0, 1.0, 1.0], [16, 24, 17], [1, 5, 5], [[1, 2], [7, 8, 9], [1, 2, 3]])


def waiting_obs(policy_name: str = "fcfs", **params):
    """The observation once B and C wait (A ran and finished), under ``policy_name``'s engine overrides."""
    policy = make_policy(policy_name, **params)
    env = make_env(policy, workload=QUEUE, backend=backend(), engine={"prefix_caching": True,
                                                                        "check_invariants": True})
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))  # A prefills and finishes
    while env.unwrapped.cluster.engines[0].waiting.size < 2:
        obs, *_ = env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    return policy, obs


def test_lpm_admits_the_most_cached_request_first_where_fcfs_keeps_arrival_order():
    policy, obs = waiting_obs("lpm")
    assert policy.act(obs)[:2].tolist() == [2, 1]  # C (rank 1) before B (rank 2)
    fcfs, obs = waiting_obs("fcfs")
    assert fcfs.act(obs)[:2].tolist() == [1, 1]


def test_lpm_without_prefix_caching_is_fcfs():
    policy = make_policy("lpm")
    env = make_env(policy, workload=QUEUE, backend=backend())
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
    while env.unwrapped.cluster.engines[0].waiting.size < 2:
        obs, *_ = env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    assert policy.act(obs)[:2].tolist() == [1, 2]  # queue order


def test_vllm_budgets_only_the_uncached_tokens():
    # A 17-token budget. Queue C first (ahead of B by swapping arrival order): counting C's whole prompt, its chunk
    # takes all 17 tokens and B waits; counting only its uncached token, 16 remain and B's first chunk starts.
    work = workload([0.0, 1.0, 1.0], [16, 17, 24], [1, 5, 5], [[1, 2], [1, 2, 3], [7, 8, 9]])
    policy = make_policy("vllm", max_num_batched_tokens=17, max_num_seqs=4)
    env = make_env(policy, workload=work, backend=backend(), engine={"prefix_caching": True})
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
    while env.unwrapped.cluster.engines[0].waiting.size < 2:
        obs, *_ = env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    assert policy.act(obs)[:2].tolist() == [1, 1]
    env = make_env(policy, workload=work, backend=backend())  # the same queue without prefix caching
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
    while env.unwrapped.cluster.engines[0].waiting.size < 2:
        obs, *_ = env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    assert policy.act(obs)[:2].tolist() == [1, 0]


def test_the_scorer_and_mc_sf_judge_a_prompt_by_its_uncached_part():
    _, obs = waiting_obs("scorer")
    assert scores(obs, 0.0, 0.0)[:2].tolist() == pytest.approx([-24.0, -1.0], abs=1e-9)
    # MC-SF by prompt, where the whole prompts order the other way: B has 16 tokens, none cached; C 17, 16 cached.
    work = workload([0.0, 1.0, 1.0], [16, 16, 17], [1, 5, 5], [[1, 2], [7, 8], [1, 2, 3]])
    policy = make_policy("mc-sf", order="prompt")
    env = make_env(policy, workload=work, backend=backend(), engine={"prefix_caching": True})
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.ones(env.unwrapped.queue_window, dtype=np.int64))
    while env.unwrapped.cluster.engines[0].waiting.size < 2:
        obs, *_ = env.step(np.zeros(env.unwrapped.queue_window, dtype=np.int64))
    action = policy.act(obs)
    assert action[1] == 1 and action[0] in (0, 2)  # C (slot 1) ranks first
