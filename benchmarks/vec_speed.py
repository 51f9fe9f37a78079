"""``gym.make_vec`` throughput with the Dict observation, with it flattened and with ``flat_obs=True``, next to
CartPole-v1.

Usage: python benchmarks/vec_speed.py [--num-envs 4] [--steps 4000]

The Dict observation (``engine``, ``queue``, ``running``, ``pool``: 983 floats at the defaults, mostly zero
padding) is stacked key by key in a vector env; ``gymnasium.wrappers.FlattenObservation`` turns it into one
float32 vector, which stacks in one copy; ``flat_obs=True`` has the env build that vector itself. All run in
``sync`` mode with admit-all actions on the ``relaxed`` task (autoreset on).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import FlattenObservation

import servegym


def rate(env: gym.vector.VectorEnv, steps: int, action: np.ndarray) -> float:
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        env.step(action)
    return steps * env.num_envs / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4000)
    args = parser.parse_args()
    n = args.num_envs
    cart = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync")
    cart_rate = rate(cart, args.steps, np.zeros(n, dtype=np.int64))
    print(f"CartPole-v1 x{n} (sync): {cart_rate:10.0f} env steps/s")
    admit = np.ones((n, 32), dtype=np.int64)
    for label, wrappers, flat in (("Dict", (), False), ("FlattenObservation", (FlattenObservation,), False),
                                  ("flat_obs=True", (), True)):
        env = gym.make_vec(servegym.ENV_ID, num_envs=n, vectorization_mode="sync", wrappers=wrappers, task="relaxed",
                           flat_obs=flat)
        value = rate(env, args.steps, admit)
        print(f"servegym relaxed x{n} (sync, {label} obs): {value:10.0f} env steps/s, {cart_rate / value:.1f}x "
              "slower than CartPole")


if __name__ == "__main__":
    main()
