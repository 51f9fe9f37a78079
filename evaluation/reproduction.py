"""docs/REPRODUCTION.md: each claim of the two papers, what servegym measured, and a verdict.

Verdicts are computed from per-seed paired comparisons (the same seed gives every policy the same requests):
- a relative-gain claim is *reproduced* when the gain's 95% CI reaches the claimed value, *partly* when the
  gain is positive but the CI stays below the claim, *not reproduced* when the CI does not exclude zero or
  the gain is negative;
- a "lowest" claim is reproduced when the policy has the lowest mean, partly when the lowest is within the
  policy's own CI, not reproduced otherwise;
- a "beats" claim counts (baseline, workload) pairs where the policy is better on mean latency with a CI
  that excludes zero: all of them reproduce the claim, some of them partly, none of them do not.
A claim checked per workload is reproduced when it holds in every workload, not reproduced when it fails
outright in more than half of them, and partly reproduced otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servegym.evaluation.grid import TaskResult
from servegym.evaluation.stats import mean_ci

REPRODUCED, PARTLY, NOT = "reproduced", "partly reproduced", "not reproduced"


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str
    measured: str
    verdict: str
    reason: str


class Table:
    """Per-seed metric values: ``table[(workload, policy, metric)] -> {seed: value}``.

    Grid-searched variants are labelled ``"<policy> <setting>"`` (``flow-control b=3``); :meth:`best_variants`
    keeps each family's best variant per workload under the family's name, as the papers report the best
    value of a grid search.
    """

    def __init__(self, results: list[TaskResult]) -> None:
        self.values: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
        for r in results:
            for metric, value in r.metrics.items():
                self.values[(r.workload, r.policy, metric)][r.seed] = value
        self.workloads = list(dict.fromkeys(r.workload for r in results))
        self.policies = list(dict.fromkeys(r.policy for r in results))

    def series(self, workload: str, policy: str, metric: str) -> np.ndarray:
        cells = self.values[(workload, policy, metric)]
        return np.array([cells[s] for s in sorted(cells)])

    def mean(self, workload: str, policy: str, metric: str) -> tuple[float, float]:
        return mean_ci(self.series(workload, policy, metric))

    def restricted(self, workloads: list[str]) -> Table:
        """A copy holding only ``workloads``."""
        out = Table([])
        out.values.update({k: dict(v) for k, v in self.values.items() if k[0] in workloads})
        out.workloads, out.policies = [w for w in self.workloads if w in workloads], list(self.policies)
        return out

    def best_variants(self, metric: str) -> tuple[Table, dict[tuple[str, str], str]]:
        """A copy where each family with variants (``name setting`` labels) is its lowest-``metric`` variant per
        workload, renamed to the family; also which variant was chosen, by (workload, family)."""
        families: dict[str, list[str]] = defaultdict(list)
        for policy in self.policies:
            families[policy.split(" ", 1)[0]].append(policy)
        out = Table([])
        chosen: dict[tuple[str, str], str] = {}
        for w in self.workloads:
            for family, members in families.items():
                best = min(members, key=lambda p: self.mean(w, p, metric)[0])
                if len(members) > 1 or best != family:
                    chosen[(w, family)] = best
                for (tw, tp, m), cells in self.values.items():
                    if tw == w and tp == best:
                        out.values[(w, family, m)] = dict(cells)
        out.workloads, out.policies = list(self.workloads), list(families)
        return out, chosen


def gain_claim(table: Table, paper: str, text: str, policy: str, others: list[str], metric: str,
               claimed: float) -> Claim:
    """Relative gain of ``policy`` over the per-seed mean of ``others`` on ``metric`` (higher is better)."""
    parts, verdicts = [], []
    for w in table.workloads:
        ours = table.series(w, policy, metric)
        theirs = np.mean([table.series(w, o, metric) for o in others], axis=0)
        mean, half = mean_ci(ours / theirs - 1.0)
        parts.append(f"{w}: {mean:+.0%} ± {half:.0%}")
        if mean - half > 0 and mean + half >= claimed:
            verdicts.append(REPRODUCED)
        elif mean - half > 0:
            verdicts.append(PARTLY)
        else:
            verdicts.append(NOT)
    return _combine(paper, text, "; ".join(parts), verdicts, f"claimed {claimed:+.0%}; per workload: gain 95% CI")


def lowest_claim(table: Table, paper: str, text: str, policy: str, metric: str, fmt: str) -> Claim:
    parts, verdicts = [], []
    for w in table.workloads:
        means = {p: table.mean(w, p, metric)[0] for p in table.policies}
        best = min(means, key=means.get)
        ours, half = table.mean(w, policy, metric)
        parts.append(f"{w}: {policy} {ours:{fmt}} ± {half:{fmt}}, lowest {best} {means[best]:{fmt}}")
        if best == policy:
            verdicts.append(REPRODUCED)
        elif ours - half <= means[best]:
            verdicts.append(PARTLY)
        else:
            verdicts.append(NOT)
    return _combine(paper, text, "; ".join(parts), verdicts, "lowest mean per workload")


def beats_claim(table: Table, paper: str, text: str, policy: str, baselines: list[str], metric: str,
                higher_is_better: bool = False) -> Claim:
    wins, total, parts = 0, 0, []
    sign = -1.0 if higher_is_better else 1.0
    for w in table.workloads:
        won = []
        for b in baselines:
            if (w, b, metric) not in table.values:
                continue
            diff = sign * (table.series(w, b, metric) - table.series(w, policy, metric))  # > 0: policy better
            mean, half = mean_ci(diff)
            total += 1
            if mean - half > 0:
                wins += 1
                won.append(b)
        parts.append(f"{w}: better than {', '.join(won) if won else 'none'}")
    verdict = REPRODUCED if wins == total else PARTLY if wins else NOT
    better = "higher" if higher_is_better else "lower"
    return Claim(paper, text, f"{wins} of {total} (baseline, workload) pairs; " + "; ".join(parts), verdict,
                 f"{better} mean {metric} with a 95% CI on the paired difference that excludes zero")


def near_claim(table: Table, paper: str, text: str, policy: str, reference: str, metric: str,
               tolerance: float) -> Claim:
    parts, verdicts = [], []
    for w in table.workloads:
        mean, half = mean_ci(table.series(w, policy, metric) / table.series(w, reference, metric) - 1.0)
        parts.append(f"{w}: {mean:+.1%} ± {half:.1%}")
        verdicts.append(REPRODUCED if mean - half <= tolerance else PARTLY if mean - 2 * half <= tolerance else NOT)
    return _combine(paper, text, "; ".join(parts), verdicts,
                    f"{metric} relative to {reference} within {tolerance:.0%} (95% CI)")


def _combine(paper: str, text: str, measured: str, verdicts: list[str], reason: str) -> Claim:
    if all(v == REPRODUCED for v in verdicts):
        verdict = REPRODUCED
    elif verdicts.count(NOT) > len(verdicts) / 2:
        verdict = NOT
    else:
        verdict = PARTLY
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in (REPRODUCED, PARTLY, NOT) if verdicts.count(v))
    return Claim(paper, text, measured, verdict, f"{reason} ({counts} of {len(verdicts)} workloads)")


TWP = "TWP (Desai, N K, Addya)"
FLOW = "Flow control (Dong & Cao)"
CONVENTIONAL = ["fcfs", "round-robin", "priority", "dynamic-batch"]
FLOW_BASELINES = ["alpha-protection", "mc", "mc-sf", "amin"]


def twp_claims(table: Table, condition: str) -> list[Claim]:
    return [
        gain_claim(table, TWP, f"+45% throughput over ServerlessLLM ({condition})", "twp", ["serverless-llm"],
                   "throughput_rps", 0.45),
        gain_claim(table, TWP, f"+58% throughput over conventional schedulers ({condition})", "twp", CONVENTIONAL,
                   "throughput_rps", 0.58),
        lowest_claim(table, TWP, f"the lowest P99 TTFT ({condition})", "twp", "ttft_p99", ".2f"),
        lowest_claim(table, TWP, f"the lowest ITL coefficient of variation ({condition})", "twp", "itl_cv", ".3f"),
    ]


def flow_claims(table: Table, setting: str) -> list[Claim]:
    table, chosen = table.best_variants("e2e_mean")
    grid = "; ".join(f"{w}: {v}" for (w, f), v in chosen.items() if f in ("flow-control", "alpha-protection"))
    suffix = f" [best of the grid per workload: {grid}]" if grid else ""
    claims = [
        beats_claim(table, FLOW, f"beats alpha-protection greedy, MC, MC-SF and A_min on latency ({setting})",
                    "flow-control", FLOW_BASELINES, "e2e_mean"),
        beats_claim(table, FLOW, f"beats them on P95 latency ({setting})", "flow-control", FLOW_BASELINES, "e2e_p95"),
        near_claim(table, FLOW, f"comes near hindsight ({setting})", "flow-control", "hindsight", "e2e_mean", 0.10),
        beats_claim(table, FLOW, f"higher token throughput than the baselines ({setting})", "flow-control",
                    FLOW_BASELINES, "throughput_tps", higher_is_better=True),
        beats_claim(table, FLOW, f"more stable KV cache utilization than the baselines ({setting})",
                    "flow-control", FLOW_BASELINES, "kv_util_std"),
    ]
    known = table.restricted([w for w in table.workloads if w.endswith("/known")])
    if "flow-control-per-class" in table.policies and known.workloads:
        claims.append(near_claim(known, FLOW, f"with per-class budgets b_k (known lengths) comes near hindsight "
                                 f"({setting})", "flow-control-per-class", "hindsight", "e2e_mean", 0.10))
    return [Claim(c.paper, c.claim, c.measured + (suffix if i == 0 else ""), c.verdict, c.reason)
            for i, c in enumerate(claims)]


CHANGES = [
    "Flow control comes near hindsight (synthetic classes): partly -> reproduced. The budget bug floored "
    "b = 1.5 to one activation per step, so l10-o60 ran 164% above hindsight; with the fix and the grid search "
    "it is within 10% in every class.",
    "TWP's four claims are now checked in two conditions. In the paper's warm, light-load regime the verdicts "
    "are the same as under the cold pool (only the ITL-CV claim reproduces): cold starts did not decide them; "
    "TWP's P99 TTFT stays above round-robin's there because it stages each prompt in chunks of C = 64 tokens "
    "per step and its window holds requests back.",
    "New claims: flow control's throughput and KV-stability claims (partly reproduced on the synthetic classes "
    "and the trace; KV stability not reproduced on the mixed classes), the mixed-classes setting, and flow "
    "control with per-class budgets b_k near hindsight.",
]
"""One line per verdict that changed since the previous report (written by hand from the two runs)."""


def render(claims: list[Claim], notes: list[str], sources: list[str]) -> str:
    lines = [
        "# Reproducing the two source papers with servegym",
        "",
        "Generated by `servegym reproduce` from the experiment files in `experiments/` (tables, tidy results "
        "and plots under `docs/results/<experiment>/`). Nothing in the environment was tuned toward the papers' "
        "numbers; the verdicts report what the simulator says. How verdicts are decided: "
        "`evaluation/reproduction.py`.",
        "",
        "| paper | claim | servegym measured | verdict |",
        "|---|---|---|---|",
    ]
    for c in claims:
        lines.append(f"| {c.paper} | {c.claim} | {c.measured} | **{c.verdict}** ({c.reason}) |")
    lines += ["", "## Changes since the previous report", ""] + [f"- {c}" for c in CHANGES]
    lines += ["", "## Readings taken and caveats", ""] + [f"- {n}" for n in notes]
    lines += ["", "## Runs", ""] + [f"- {s}" for s in sources]
    return "\n".join(lines) + "\n"


NOTES = [
    "The TWP experiments run on the `paper-v100-llama3.2-3b` profile, which takes l_min = 43 ms and B0 = 8 from "
    "the TWP paper; alpha, the prefill terms, the KV size and the cold start are estimates (see the profile "
    "file). Every TWP number below inherits them. (The default profile is now `a100-llama3-8b`; the paper "
    "experiments pin their own.)",
    "TWP's window floor. The paper: the minimum keeps \"enough requests active to use available GPU "
    "parallelism\". Reading: H_min is B0 = 8 times the mean estimated remaining tokens of the running requests "
    "(of the waiting ones when none runs), never below `window_min` = 32 tokens (`min_active_requests`).",
    "TWP's chunked prefill. The paper: \"fixed-size chunks processed one per decode step\". Reading: each "
    "admitted prompt ingests at most C = 64 tokens per step (`chunking: per_request`, the default); the earlier "
    "reading, at most C prefill tokens per step over all prompts (about 1.25k tokens/s at 43 ms), is kept as "
    "`chunking: total`.",
    "TWP's regime. The paper's Table III reports a TTFT of about 52 ms and an ITL of 43-45 ms for every "
    "scheduler in every scenario: no cold starts, and loads that kept the batch near B0. Reading: two conditions. "
    "*Warm pool* (`twp_paper_warm`): two warm containers, two light loads at which FCFS's mean ITL stays within "
    "10% of l_min (2 and 4 req/s, GSM8K-shaped prompts), besides the heavier scenarios. *Cold pool* "
    "(`twp_paper`): two containers that start cold and go cold after 30 s idle, so cold starts enter TTFT (the "
    "paper's eq. (1)) for every scheduler alike, ServerlessLLM keeping its faster loading.",
    "The TWP paper's 18 req/s is far beyond what B0 = 8 at about 43 ms per step serves: 8 sequences / 43 ms is "
    "186 tokens/s, about 2.9 req/s at the paper's mean output of 65 tokens, yet the paper reports far lower "
    "throughputs than its offered load without saying where the excess goes. servegym reads it literally: 250 "
    "requests arrive within about 14 s and queue, so every scheduler runs overloaded on that workload.",
    "Throughput is finished requests over the makespan (first arrival to last completion), so a policy that "
    "leaves a long drain (TWP, whose window admits less) pays for it.",
    "TWP forces in any request that has waited T_max = 200 steps; under sustained overload those forced "
    "admissions, not the window, set the batch (see docs/results/twp_paper/twp_feedback.png).",
    "Flow control's budget. A fractional b is a rate: any n saturated steps admit floor(n b) or ceil(n b) "
    "requests. (Before this run b was floored above 1: b = 1.5 admitted one per step, which made l10-o60 look "
    "+164% worse than hindsight.)",
    "Flow control's grid searches. The paper reports the best b and the best alpha of a grid search per "
    "workload; servegym runs b in {1.5, 2, 3, 4.5, 6, 9, 12} and alpha in {0, 0.05, 0.1, 0.2, 0.3} and the "
    "claims compare the best variant per workload (named in the first claim of each setting).",
    "The flow-control synthetic setting runs on the `discrete-time` profile (1 s per step, no batch cost): the "
    "paper's model is discrete time. Latencies there are in steps. The classes run alone (`flow_control_"
    "synthetic`) and together in one system (`flow_control_mixed`: equal shares at 80% of the mixture's "
    "necessary bound; the paper's mixing proportions were not available to quote). With known lengths the "
    "mixed setting also runs flow control with per-class budgets b_k from the sufficient condition.",
    "Flow control's \"more stable KV cache utilization\": read as a lower time-weighted standard deviation of "
    "the used KV fraction (`kv_util_std`). Its throughput claim: higher token throughput (`throughput_tps`).",
    "A_min's eviction order: the paper evicts in ascending order of predicted output length; servegym's A_min "
    "now does so on its own estimate (the lower end, doubled when outgrown; the `shortest_predicted` rule). It "
    "evicted by fewest generated tokens before.",
    "The flow-control paper's real-data source is replaced by the bundled Azure LLM code trace (CC-BY-4.0), "
    "compressed to 10 and 50 req/s; its long prompts (mean 2,048 tokens) make prefill the bottleneck on the V100 "
    "profile, a regime the paper's memory-only analysis does not model.",
    "MC and MC-SF plan with upper-bound lengths: with unknown lengths (the interval [1, max_tokens]) they admit "
    "very few requests, which is what their rule implies, not a tuning choice.",
    "The best b sits at the top of the grid (12) in every synthetic workload, and the best alpha at 0.1: in "
    "discrete time with no batch cost, faster activation only shortens waits while the cache holds, so the "
    "grid's edge, not an interior optimum, wins.",
    "Passages quoted above are the ones available to servegym's authors; for the other readings (equal class "
    "shares, the b and alpha grids) the papers' exact wording was not at hand, and each reading is stated as "
    "such.",
]


def write_reproduction(results_by_experiment: dict[str, list[TaskResult]], seeds: dict[str, int],
                       path: Path) -> list[Claim]:
    claims: list[Claim] = []
    if "twp_paper_warm" in results_by_experiment:
        claims += twp_claims(Table(results_by_experiment["twp_paper_warm"]), "warm pool, the paper's regime")
    if "twp_paper" in results_by_experiment:
        claims += twp_claims(Table(results_by_experiment["twp_paper"]), "cold pool")
    if "flow_control_synthetic" in results_by_experiment:
        claims += flow_claims(Table(results_by_experiment["flow_control_synthetic"]), "synthetic classes")
    if "flow_control_mixed" in results_by_experiment:
        claims += flow_claims(Table(results_by_experiment["flow_control_mixed"]), "mixed classes")
    if "flow_control_trace" in results_by_experiment:
        claims += flow_claims(Table(results_by_experiment["flow_control_trace"]), "Azure trace")
    sources = [f"`experiments/{name}.yaml`: {seeds[name]} seeds, {len(results)} runs; tables in "
               f"[`results/{name}/summary.md`](results/{name}/summary.md)"
               for name, results in results_by_experiment.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(claims, NOTES, sources))
    return claims
