"""Does the scheduler matter? Each named scenario's headroom: random admission, FCFS, the best hand-coded
policy and the clairvoyant greedy packer (true lengths, not a bound), over seeds with 95% confidence intervals
(``servegym scenarios``).

A scenario is *decision-sensitive* when the clairvoyant greedy packer or the best hand-coded policy beats FCFS by at
least 15% on mean end-to-end latency or on SLO goodput; otherwise it is *flat*:
any sensible policy scores the same there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servegym.backends import load_profile
from servegym.engine import EngineConfig
from servegym.evaluation.executor import RunStore
from servegym.evaluation.grid import run_grid
from servegym.evaluation.spec import Experiment, PolicySpec, WorkloadSpec
from servegym.evaluation.stats import MIN_VERDICT_SEEDS, mean_ci
from servegym.stability import workload_stability
from servegym.validation import count
from servegym.workloads import WORKLOADS, make_workload
from servegym.workloads.scenarios import profile_for

HAND_CODED = ("fcfs", "twp", "flow-control", "vllm", "sarathi", "priority", "dynamic-batch", "mc", "mc-sf", "amin",
              "alpha-protection")
"""The hand-coded policies whose best sets the scenario's achievable improvement."""
REFERENCES = ("random", "clairvoyant-greedy")
SENSITIVE = 0.15
"""Relative improvement over FCFS that makes a scenario decision-sensitive."""
SCENARIOS = ("low", "medium", "high", "burst", "gamma-bursty", "twp-gsm8k", "azure-code", "azure-code-2x",
             "long-output", "tight-memory")
"""The scenarios the report covers (``cpu-fidelity`` belongs to the real backend's check)."""
METRICS = ("e2e_mean", "goodput_rps", "kv_util_max", "num_preemptions", "num_unfinished")


@dataclass(frozen=True)
class PolicyScore:
    policy: str
    metrics: dict[str, tuple[float, float]]
    """metric -> (mean, 95% CI half-width) over seeds."""

    def mean(self, metric: str) -> float:
        return self.metrics[metric][0]


@dataclass(frozen=True)
class Headroom:
    scenario: str
    profile: str
    load_ratio: float
    scores: dict[str, PolicyScore]

    @property
    def best(self) -> PolicyScore:
        """The hand-coded policy with the lowest mean latency among those that finish every request."""
        complete = [self.scores[p] for p in HAND_CODED if self.scores[p].mean("num_unfinished") == 0]
        return min(complete or [self.scores[p] for p in HAND_CODED], key=lambda s: s.mean("e2e_mean"))

    def gain(self, policy: PolicyScore) -> tuple[float, float]:
        """Relative improvement over FCFS: (latency reduction, goodput increase)."""
        fcfs = self.scores["fcfs"]
        latency = 1.0 - policy.mean("e2e_mean") / fcfs.mean("e2e_mean")
        base = fcfs.mean("goodput_rps")
        if base > 0:
            goodput = policy.mean("goodput_rps") / base - 1.0
        else:  # no goodput to improve on: a policy with some is infinitely better, one with none no better
            goodput = math.inf if policy.mean("goodput_rps") > 0 else 0.0
        return latency, goodput

    @property
    def sensitive(self) -> bool:
        return any(max(self.gain(s)) >= SENSITIVE for s in (self.best, self.scores["clairvoyant-greedy"]))


def measure(scenario: str, seeds: int = 10, workers: int | None = None, progress: bool = False,
            max_steps: int = 30_000, store: RunStore | None = None) -> Headroom:
    """Run the reference and hand-coded policies on ``scenario`` (its own profile, predicted lengths).

    Episodes stop after ``max_steps`` iterations; a policy that leaves requests unfinished by then cannot be
    the best (its mean covers only the requests it finished). With a ``store``, runs it holds are not run again
    and each new one is kept as it finishes.
    """
    count("seeds", seeds, "seeds")
    if scenario not in WORKLOADS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {sorted(WORKLOADS)}")
    profile = profile_for(scenario)
    experiment = Experiment(
        name=f"headroom-{scenario}", policies=tuple(PolicySpec(p) for p in (*HAND_CODED, *REFERENCES)),
        workloads=(WorkloadSpec(scenario, scenario),), seeds=tuple(range(seeds)), profile=profile,
        engine={"length_mode": "predicted"}, max_steps=max_steps,
    )
    results = run_grid(experiment, workers=workers, progress=progress, store=store)
    scores = {}
    for policy in (*HAND_CODED, *REFERENCES):
        runs = [r for r in results if r.policy == policy]
        scores[policy] = PolicyScore(policy, {m: mean_ci(np.array([r.metrics[m] for r in runs])) for m in METRICS})
    report = workload_stability(make_workload(scenario), load_profile(profile), EngineConfig(length_mode="predicted"))
    return Headroom(scenario, profile, report.load_ratio, scores)


def _cell(score: PolicyScore, metric: str, scale: float = 1.0, digits: int = 2) -> str:
    mean, half = score.metrics[metric]
    half_text = "" if math.isnan(half) else f" ± {half * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f}{half_text}"


def _verdict(h: Headroom) -> str:
    return "**decision-sensitive**" if h.sensitive else "flat"


def markdown(rows: list[Headroom], seeds: int) -> str:
    judged = seeds >= MIN_VERDICT_SEEDS  # the rule reproduce and bench apply
    sensitive = [h.scenario for h in rows if h.sensitive]
    flat = [h.scenario for h in rows if not h.sensitive]
    lines = [
        "# Scenario headroom: where scheduling decisions matter",
        "",
        "Generated by `servegym scenarios` (do not edit by hand). Each scenario runs on its own profile with "
        f"predicted output lengths, {seeds} seeds per policy; cells are mean ± 95% CI half-width. Latency is the "
        "mean end-to-end latency of finished requests (s); goodput counts requests/s that meet both SLOs, "
        "TTFT <= 2 s and time per output token <= 0.2 s. Load ratio is the flow-control paper's "
        "`lambda E[l o + (o + o^2)/2] / M` (KV memory only). *Best* is the hand-coded policy with the lowest "
        "latency among those that finish every "
        "request. A scenario is **decision-sensitive** when the clairvoyant greedy packer (true lengths; not a bound) "
        "or the best policy is at least 15% better "
        "than FCFS on latency or goodput.",
        "",
        f"**Decision-sensitive:** {', '.join(sensitive) or 'none'}. **Flat:** {', '.join(flat) or 'none'}."
        if judged else f"**No verdict:** {seeds} seeds per policy, fewer than the {MIN_VERDICT_SEEDS} a verdict needs.",
        "",
        "| scenario | profile | load ratio | KV peak (FCFS) | preemptions (FCFS) | random | FCFS | best "
        "| clairvoyant greedy "
        "| best gain | clairvoyant gain | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for h in rows:
        fcfs, best, hind, rand = h.scores["fcfs"], h.best, h.scores["clairvoyant-greedy"], h.scores["random"]
        gains = [h.gain(s) for s in (best, hind)]
        lines.append(
            f"| {h.scenario} | {h.profile} | {h.load_ratio:.2f} | {fcfs.mean('kv_util_max'):.0%} | "
            f"{fcfs.mean('num_preemptions'):.0f} | {_cell(rand, 'e2e_mean')} s | {_cell(fcfs, 'e2e_mean')} s | "
            f"{best.policy}: {_cell(best, 'e2e_mean')} s | {_cell(hind, 'e2e_mean')} s | "
            f"{gains[0][0]:+.0%} lat, {gains[0][1]:+.0%} goodput | {gains[1][0]:+.0%} lat, {gains[1][1]:+.0%} goodput "
            f"| {_verdict(h) if judged else 'undetermined'} |"
        )
    lines += ["", "## Goodput (req/s within SLO)", "", "| scenario | random | FCFS | best | clairvoyant greedy |",
              "|---|---|---|---|---|"]
    for h in rows:
        lines.append(f"| {h.scenario} | {_cell(h.scores['random'], 'goodput_rps')} | "
                     f"{_cell(h.scores['fcfs'], 'goodput_rps')} | {h.best.policy}: {_cell(h.best, 'goodput_rps')} | "
                     f"{_cell(h.scores['clairvoyant-greedy'], 'goodput_rps')} |")
    lines += ["", "## Every hand-coded policy's mean latency (s)", "",
              "| scenario | " + " | ".join(HAND_CODED) + " |", "|---|" + "---|" * len(HAND_CODED)]
    for h in rows:
        cells = []
        for p in HAND_CODED:
            unfinished = h.scores[p].mean("num_unfinished")
            cells.append(f"{h.scores[p].mean('e2e_mean'):.2f}" + (f" ({unfinished:.0f} left)" if unfinished else ""))
        lines.append(f"| {h.scenario} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
