"""Env steps per second at 64 running and 256 waiting requests, next to CartPole-v1 in the same run.

Usage: python benchmarks/step_speed.py [--steps 20000]

Both envs go through ``gym.make`` (so both pay Gymnasium's wrappers) and step with a fixed, precomputed
action. The servegym state is held at exactly 64 decoding and 256 waiting requests: 320 requests arrive at
t=0 with outputs longer than the measurement, FCFS-style admission is capped by ``max_num_seqs=64``, and
the measured steps send an all-zero action after the batch fills.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import servegym
from servegym.backends import DEFAULT_PROFILE
from servegym.workloads import FixedWorkload, RequestSpec


def time_steps(env: gym.Env, action, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            raise RuntimeError("episode ended during the measurement; lengthen the workload")
    return steps / (time.perf_counter() - start)


def servegym_rate(steps: int, repeats: int, profile: str) -> tuple[float, dict]:
    n = 320
    spec = RequestSpec(np.zeros(n), np.full(n, 100), np.full(n, steps * repeats + 1000))
    engine = {"max_num_seqs": 64, "max_tokens": 10**6, "num_kv_blocks": 10**7}
    env = gym.make(servegym.ENV_ID, workload=FixedWorkload(spec), engine=engine, profile=profile,
                   max_episode_steps=10**9)
    env.reset(seed=0)
    w = env.unwrapped.queue_window
    admit = np.ones(w, dtype=np.int64)
    while env.unwrapped.engine.num_running < 64 or env.unwrapped.engine.num_prefilling:
        env.step(admit)
    idle = np.zeros(w, dtype=np.int64)
    rates = [time_steps(env, idle, steps) for _ in range(repeats)]
    e = env.unwrapped.engine
    return max(rates), {"running": e.num_running, "waiting": e.waiting.size}


def cartpole_rate(steps: int, repeats: int) -> float:
    env = gym.make("CartPole-v1", max_episode_steps=None)
    env.reset(seed=0)
    rates = []
    for _ in range(repeats):
        env.reset(seed=0)
        # CartPole falls within a few hundred steps; alternate pushes keep it up long enough per chunk.
        start, done_steps = time.perf_counter(), 0
        while done_steps < steps:
            _, _, terminated, truncated, _ = env.step(done_steps & 1)
            done_steps += 1
            if terminated or truncated:
                env.reset()
        rates.append(steps / (time.perf_counter() - start))
    return max(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", nargs="+", default=[DEFAULT_PROFILE, "paper-v100-llama3.2-3b"],
                        help="profiles to time (schema 2 costs more per step than schema 1)")
    args = parser.parse_args()
    cart = cartpole_rate(args.steps, args.repeats)
    print(f"CartPole-v1:                                   {cart:10.0f} steps/s  ({1e6 / cart:6.1f} us/step)")
    for profile in args.profile:
        serve, state = servegym_rate(args.steps, args.repeats, profile)
        print(f"servegym/Serving-v0 on {profile} ({state['running']} running, {state['waiting']} waiting): "
              f"{serve:8.0f} steps/s  ({1e6 / serve:6.1f} us/step), {cart / serve:.2f}x CartPole")


if __name__ == "__main__":
    main()
