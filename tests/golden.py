"""Fingerprints of whole episode logs on fixed seeds: a refactor that changes behaviour changes a hash.

``python -m tests.golden`` rewrites ``tests/data/golden_logs.json``; do that only for a change that is meant
to alter episodes, and say which in the commit message.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).parent / "data" / "golden_logs.json"

# (label, policy, policy params, workload, engine settings, pool settings, seed, step limit). The "-predicted" cases
# run truth_interval, the interval "predicted" meant when their fingerprints were taken (issue 51).
CASES = [
    ("fcfs-low-unknown", "fcfs", {}, "low", {}, {}, 0, 600),
    ("fcfs-burst-tight-known", "fcfs", {}, "burst", {"num_kv_blocks": 300, "length_mode": "known"}, {}, 1, 800),
    ("twp-burst-predicted", "twp", {}, "burst", {"length_mode": "truth_interval"}, {}, 2, 800),
    ("twp-high-tight-unknown", "twp", {}, "high", {"num_kv_blocks": 400}, {}, 3, 600),
    ("flow-control-medium-tight", "flow-control", {"activation_budget": 1.7}, "medium", {"num_kv_blocks": 300},
     {}, 4, 800),
    ("vllm-burst-tight", "vllm", {}, "burst", {"num_kv_blocks": 300}, {}, 5, 600),
    ("sarathi-high", "sarathi", {}, "high", {}, {}, 6, 500),
    ("mc-sf-burst-predicted", "mc-sf", {}, "burst", {"num_kv_blocks": 400, "length_mode": "truth_interval"}, {}, 7,
     600),
    # The windowed variant sorts the env's 32 visible requests: MC-SF's episodes before it sorted the whole queue.
    ("mc-sf-window32-burst-predicted", "mc-sf", {"window": 32}, "burst",
     {"num_kv_blocks": 400, "length_mode": "truth_interval"}, {}, 7, 600),
    ("amin-burst-predicted", "amin", {}, "burst", {"num_kv_blocks": 120, "length_mode": "truth_interval"}, {}, 8, 600),
    ("alpha-medium-tight", "alpha-protection", {}, "medium", {"num_kv_blocks": 300}, {}, 9, 600),
    ("clairvoyant-greedy-burst", "clairvoyant-greedy", {}, "burst", {"num_kv_blocks": 400}, {}, 10, 600),
    ("dynamic-batch-high", "dynamic-batch", {}, "high", {}, {}, 11, 500),
    ("priority-pool-cold", "priority", {}, "burst", {"num_kv_blocks": 600},
     {"num_containers": 3, "keep_alive_s": 5.0, "start_cold": True}, 12, 900),
    ("serverless-pool", "serverless-llm", {}, "burst", {}, {"num_containers": 2, "keep_alive_s": 0.3}, 13, 900),
    ("round-robin-pool", "round-robin", {}, "medium", {"num_kv_blocks": 400, "length_mode": "truth_interval"},
     {"num_containers": 2}, 14, 900),
    # Trace replays with long prompts: many rows prefill at once, few (FCFS) or many (TWP, C=32) get a chunk.
    ("fcfs-azure", "fcfs", {}, "azure", {"length_mode": "truth_interval"}, {}, 15, 2500),
    ("twp-azure-small-chunks", "twp", {"prefill_chunk_tokens": 32}, "azure", {}, {}, 16, 2500),
    ("sarathi-azure-tight", "sarathi", {}, "azure", {"num_kv_blocks": 1500}, {}, 17, 2500),
]


def _digest(parts: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for part in parts:
        a = np.asarray(part)
        a = np.round(a.astype(np.float64), 9) if a.dtype.kind == "f" else a.astype(np.int64)
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def fingerprint(log) -> dict[str, str]:
    """Hashes of the request table, the step log and the token segments, by position (not column name)."""
    requests = [log.arrival_s, log.num_prompt_tokens, log.num_output_tokens, log.output_lo, log.output_hi,
                log.truncated, log.state, log.admit_s, log.first_token_s, log.finish_s, log.num_preemptions,
                log.reject_reason, log.container, log.cold_start, log.load_wait_s]
    segments = [np.asarray(log.seg_req), np.asarray(log.seg_first), np.asarray(log.seg_last)]
    return {"requests": _digest(requests), "steps": _digest([log.steps()]), "segments": _digest(segments)}


def _workload(name: str, speedup: float = 1.0):
    """The golden workloads, spelt out so that re-tuning the named scenarios does not move them. ``speedup``
    compresses time: the same number of requests, arriving ``speedup`` times as fast."""
    from servegym.workloads import MarkovModulated, Poisson, SyntheticWorkload, TraceWorkload, bundled_trace
    from servegym.workloads.scenarios import TWP_OUTPUTS, TWP_PROMPTS

    if name == "azure":
        return TraceWorkload(str(bundled_trace()), time_scale=1.0 / speedup, max_requests=700)

    s = speedup
    burst = MarkovModulated(base_rate=2.0 * s, burst_rate=14.0 * s, calm_s=10.0 / s, burst_s=3.0 / s)
    arrivals = {"low": Poisson(2.5 * s), "medium": Poisson(5.0 * s), "high": Poisson(7.5 * s), "burst": burst}[name]
    return SyntheticWorkload(arrivals, 60.0 / s, prompt=TWP_PROMPTS, output=TWP_OUTPUTS)


PROFILE = "paper-v100-llama3.2-3b"
"""The golden episodes' profile, pinned whatever the default."""
DEFAULT_PROFILE = "a100-llama3-8b"
"""The default schema-2 profile (``servegym.backends.DEFAULT_PROFILE`` when these were made): every case runs on
it too, labelled ``<case>@<profile>``, with arrivals 6x as fast (its capacity over the paper profile's, about
16 vs 2.5 req/s at low load), so that its episodes queue and preempt as the paper profile's do."""
SPEEDUP = {PROFILE: 1.0, DEFAULT_PROFILE: 6.0}
PROFILES = tuple(SPEEDUP)


def label(case, profile: str = PROFILE) -> str:
    """The key of a case's fingerprints in ``golden_logs.json`` (paper-profile cases keep their old keys)."""
    return case[0] if profile == PROFILE else f"{case[0]}@{profile}"


def run_case(case, profile: str = PROFILE) -> tuple[dict[str, str], float]:
    from servegym.policies import make_policy
    from servegym.runner import make_env

    _, name, params, workload, engine, pool, seed, steps = case
    policy = make_policy(name, **params)
    env = make_env(policy, workload=_workload(workload, SPEEDUP[profile]), profile=profile, engine=engine,
                   pool=pool, max_episode_steps=steps)
    obs, _ = env.reset(seed=seed)
    policy.reset()
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
        total += reward
        done = terminated or truncated
    return fingerprint(env.unwrapped.cluster.log), round(total, 6)


def compute() -> dict[str, dict]:
    out = {}
    for profile in PROFILES:
        for case in CASES:
            prints, total = run_case(case, profile)
            out[label(case, profile)] = {**prints, "reward": total}
    return out


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(compute(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
