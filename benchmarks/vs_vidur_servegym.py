"""servegym's side of ``benchmarks/vs_vidur.py``: one episode over a trace, run as its own process and timed whole.

Usage: ``python benchmarks/vs_vidur_servegym.py TRACE POLICY PROFILE MAX_NUM_SEQS MAX_NUM_BATCHED_TOKENS`` (the
limits of Vidur's scheduler in the benchmark). A policy whose parameters set those limits (vLLM-style's token budget
and sequence cap) gets them, and prompts are prefilled whole up to the token budget, as Vidur's vLLM scheduler
does; a policy whose own overrides would change a limit is an error. It loads only what the episode needs and
prints its results as one JSON line: requests, finished, busy iterations, makespan, mean E2E and TTFT, KV tokens,
and the engine limits it ran with.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields

import numpy as np

from servegym.engine import STEP_INDEX
from servegym.policies import POLICIES, make_policy
from servegym.runner import make_env
from servegym.workloads import TraceWorkload


def main(trace: str, policy_name: str, profile: str, max_num_seqs: int, max_num_batched_tokens: int) -> None:
    limits = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
              "prefill_chunk_tokens": max_num_batched_tokens}
    params = POLICIES[policy_name].Params
    own = {f.name for f in fields(params)} if params is not None else set()
    policy = make_policy(policy_name, **{k: v for k, v in limits.items() if k in own})
    env = make_env(policy, max_episode_steps=10**8, workload=TraceWorkload(trace), profile=profile,
                   engine={"length_mode": "unknown", **limits})
    config = env.unwrapped.engine_config
    ran = {name: getattr(config, name) for name in limits}
    if ran != limits:
        sys.exit(f"{policy_name}'s own engine overrides change the benchmark's limits: {ran}, not {limits}")
    obs, _ = env.reset(seed=0)
    policy.reset()
    done = False
    while not done:
        obs, _, terminated, truncated, _ = env.step(policy.act(obs))
        done = terminated or truncated
    log = env.unwrapped.cluster.log
    steps = log.steps(0)
    busy = int(np.count_nonzero(steps[:, STEP_INDEX["num_decode_tokens"]] + steps[:, STEP_INDEX["num_prefill_tokens"]]))
    e2e = log.finish_s - log.arrival_s
    print(json.dumps({"requests": int(log.num_requests), "finished": int(np.isfinite(log.finish_s).sum()),
                      "iterations": busy, "makespan_s": float(np.nanmax(log.finish_s) - log.arrival_s.min()),
                      "mean_e2e_s": float(np.nanmean(e2e)),
                      "mean_ttft_s": float(np.nanmean(log.first_token_s - log.arrival_s)),
                      "kv_tokens": int(log.num_kv_blocks * log.block_size), **ran}))


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:4], int(sys.argv[4]), int(sys.argv[5]))
