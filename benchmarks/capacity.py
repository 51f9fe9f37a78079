"""Where the shipped profile saturates: FCFS on the TWP length mix at rising Poisson rates.

Usage: python benchmarks/capacity.py [--profile NAME] [--duration 300]

Prints, per rate, the served throughput, the mean decode batch while requests arrive, the backlog when the
last one arrives, and P99 TTFT and ITL. The capacity is the highest rate whose backlog stays near zero;
the named scenarios (low/medium/high/burst) are set against it (see workloads/scenarios.py).
"""

from __future__ import annotations

import argparse

import numpy as np

from servegym.backends import DEFAULT_PROFILE
from servegym.engine import STEP_INDEX
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode
from servegym.workloads import Poisson, SyntheticWorkload
from servegym.workloads.scenarios import TWP_OUTPUTS, TWP_PROMPTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--rates", type=float, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8, 10, 12])
    args = parser.parse_args()
    print(f"{'rate':>6} {'served rps':>10} {'batch':>7} {'backlog':>8} {'TTFT P99 s':>11} {'ITL P99 ms':>11}")
    for rate in args.rates:
        workload = SyntheticWorkload(Poisson(rate), args.duration, prompt=TWP_PROMPTS, output=TWP_OUTPUTS)
        policy = make_policy("fcfs")
        env = make_env(policy, workload=workload, profile=args.profile, max_episode_steps=200_000)
        result = run_episode(env, policy, seed=0)
        s = result.summary
        steps = result.log.steps()
        arrivals_end = result.log.arrival_s[-1]
        during = steps[:, STEP_INDEX["end_s"]] <= arrivals_end
        batch = float(np.mean(steps[during, STEP_INDEX["num_decode_tokens"]])) if during.any() else 0.0
        backlog = int(steps[during, STEP_INDEX["num_waiting"]][-1]) if during.any() else 0  # when the last arrives
        served = s["num_finished"] / s["makespan_s"]
        print(f"{rate:6.1f} {served:10.2f} {batch:7.1f} {backlog:8d} {s['ttft_p99']:11.2f} "
              f"{s['itl_p99'] * 1e3:11.1f}")


if __name__ == "__main__":
    main()
