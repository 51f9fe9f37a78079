"""Whole episodes: arrivals, admissions, prefills, preemptions and finishes, next to CartPole-v1 in one run.

Usage: python benchmarks/episode_speed.py [--policies fcfs twp flow-control vllm] [--repeats 3]
                                         [--engine auto|compiled|python]

Each policy plays one seeded episode of each workload through ``gym.make`` (Gymnasium's wrappers included) and its
own ``act``; the figure is the best of ``--repeats`` runs. Printed per (workload, policy): engine iterations (a
stateless policy's episode skips the iterations with no decision, ``make_env``'s ``skip_idle``, so it calls
``step`` fewer times), wall time, microseconds per iteration, the ratio to a CartPole-v1 step, and requests
simulated per second. Each run is paired with a CartPole-v1 measurement taken just before it in the same process,
so that both see the same machine; the ratio is the best over the pairs (a shared 2-core machine drifts by 10%
within a minute). ``--engine`` picks the engine (default: the compiled one when built, see
``servegym.engine.compiled``).

``mooncake-conversation`` plays a window of the Mooncake conversation trace (one replica's sessions) with prefix
caching on; ``x CP/step`` divides by the env steps the policy took rather than the iterations run.
``cluster-routing`` plays one test episode of that task (8 A100 replicas, the whole Mooncake conversation trace's
rate, routed by each of ``--routers``): ``us/iter`` and ``x CartPole`` are per replica-iteration. ``azure-5000``
replays the first 5,000 requests of the bundled Azure code trace; trace parsing is timed apart,
once, cold. This benchmark compares with CartPole only: a comparison with another simulator runs both side by
side as whole processes on the same requests (``benchmarks/vs_vidur.py``).
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import numpy as np

from servegym.engine.compiled import ENGINES, engine_class
from servegym.policies import make_policy
from servegym.runner import make_env, serving_env
from servegym.workloads import TraceWorkload, bundled_trace, make_workload

CLUSTER = "cluster-routing"
"""The routing task: an 8-replica episode (seed 0), played by each of ``--routers``; its iterations are
replica-iterations (every replica's, summed) and its steps are routing decisions."""
WORKLOADS = ("azure-5000", "medium", "burst", "mooncake-conversation", CLUSTER)
PREFIX_CACHED = {"mooncake-conversation"}
"""Workloads played with prefix caching on (their requests carry prefix chains)."""
CARTPOLE_PAIR_STEPS = 20_000
"""CartPole-v1 steps measured just before each episode run (about 0.1 s)."""


def workload(name: str):
    if name == "azure-5000":
        return TraceWorkload(str(bundled_trace()), max_requests=5000)
    return make_workload(name)


def cartpole_us(steps: int = 50_000) -> float:
    env = gym.make("CartPole-v1", max_episode_steps=None)
    env.reset(seed=0)
    start = time.perf_counter()
    for i in range(steps):
        _, _, terminated, truncated, _ = env.step(i & 1)
        if terminated or truncated:
            env.reset()
    return (time.perf_counter() - start) / steps * 1e6


def episode(policy_name: str, workload_name: str) -> tuple[int, int, float, int]:
    """(engine iterations, env steps, wall seconds, requests) of one seeded episode."""
    policy = make_policy(policy_name)
    if workload_name == CLUSTER:
        env = make_env(policy, task=CLUSTER, split="test")
    else:
        env = make_env(policy, max_episode_steps=10**7, workload=workload(workload_name),
                       engine={"length_mode": "predicted", "prefix_caching": workload_name in PREFIX_CACHED})
    obs, _ = env.reset(seed=0)
    policy.reset()
    steps, done = 0, False
    start = time.perf_counter()
    while not done:
        obs, _, terminated, truncated, _ = env.step(policy.act(obs))
        steps += 1
        done = terminated or truncated
    wall = time.perf_counter() - start
    return serving_env(env).num_steps, steps, wall, serving_env(env).cluster.log.num_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", default=["fcfs", "twp", "flow-control", "vllm"])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--routers", nargs="+", default=["router-round-robin", "router-kv-aware"],
                        help=f"the policies of the {CLUSTER} task")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine", choices=ENGINES, default="auto")
    args = parser.parse_args()
    os.environ["SERVEGYM_ENGINE"] = args.engine
    print(f"engine: {engine_class(args.engine).__name__}")
    start = time.perf_counter()  # the first read in this process: the parse is cold
    workload("azure-5000").sample(np.random.default_rng(0))
    print(f"parse the bundled Azure trace (cold): {time.perf_counter() - start:.3f} s")
    cart = min(cartpole_us() for _ in range(args.repeats))
    print(f"CartPole-v1: {cart:.2f} us/step (best of {args.repeats}; each run below is paired with its own)")
    print(f"{'workload':<22} {'policy':<22} {'iters':>7} {'steps':>7} {'wall s':>8} {'us/iter':>8} "
          f"{'x CartPole':>10} {'x CP/step':>9} {'requests/s':>11}")
    for name in args.workloads:
        for policy in args.routers if name == CLUSTER else args.policies:
            runs = []
            for _ in range(args.repeats):
                cart_us = cartpole_us(CARTPOLE_PAIR_STEPS)
                iters, steps, wall, requests = episode(policy, name)
                runs.append((wall, iters, steps, requests, wall / iters * 1e6 / cart_us, wall / steps * 1e6 / cart_us))
            wall, iters, steps, requests, _, _ = min(runs)
            ratio, per_step = min(run[4] for run in runs), min(run[5] for run in runs)
            us = wall / iters * 1e6
            print(f"{name:<22} {policy:<22} {iters:>7} {steps:>7} {wall:>8.3f} {us:>8.1f} {ratio:>10.2f} "
                  f"{per_step:>9.2f} {requests / wall:>11.0f}")


if __name__ == "__main__":
    main()
