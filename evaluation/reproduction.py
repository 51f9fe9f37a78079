"""docs/REPRODUCTION.md: each claim of the two papers, what servegym measured, and a verdict (the rule:
:mod:`servegym.evaluation.verdicts`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servegym.evaluation.grid import TaskResult
from servegym.evaluation.reproduction_notes import CHANGES, NOTES
from servegym.evaluation.stats import Interval, paired_ratio
from servegym.evaluation.verdicts import (  # noqa: F401  (re-exported: the report's callers and tests use them)
    NOT,
    PARTLY,
    REPRODUCED,
    VERDICT_RULES,
    Claim,
    Table,
    beats_claim,
    combine_verdicts,
    every_pair_verdict,
    gain_claim,
    gain_verdict,
    group_name,
    lowest_claim,
    near_claim,
    range_verdict,
    within_verdict,
)

TWP = "TWP (Desai, N K, Addya)"
FLOW = "Flow control (Dong & Cao)"
CONVENTIONAL = ["fcfs", "round-robin", "priority", "dynamic-batch"]
FLOW_BASELINES = ["alpha-protection", "mc", "mc-sf", "amin"]
FLOW_METRICS = ("e2e_mean_all_s", "e2e_p95_all_s", "throughput_tps", "throughput_rps", "kv_util_std")
"""The metrics flow control's claims compare; baselines identical on all of them are counted once. Latency counts
every arrived request, the unfinished to the episode's end: a policy that thrashes and finishes a few requests
quickly (alpha-protection with restarts) must not look fast by leaving the rest unserved."""
BEST_MEASURED = "best measured"
"""The per-seed lowest latency of every policy run (the clairvoyant greedy packer included): the hindsight optimum
can only be lower, so coming within X% of it is necessary for "near hindsight", not sufficient."""


TWP_BASELINES = ["serverless-llm", *CONVENTIONAL]
TWP_TTFT_BEATEN = ["round-robin", "dynamic-batch", "serverless-llm"]
"""The schedulers the TWP paper's TTFT-percentile figure shows above TWP at P99 (Priority and FCFS are below it)."""


def twp_claims(table: Table, condition: str) -> list[Claim]:
    return [
        gain_claim(table, TWP, f"+45% throughput over ServerlessLLM ({condition})", "twp", ["serverless-llm"],
                   "throughput_rps", 0.45),
        gain_claim(table, TWP, f"+58% throughput over conventional schedulers ({condition})", "twp", CONVENTIONAL,
                   "throughput_rps", 0.58),
        beats_claim(table, TWP, f"lower P99 TTFT than round-robin, dynamic batching and ServerlessLLM, as the "
                    f"paper's TTFT-percentile figure shows (Priority and FCFS are lower there) ({condition})", "twp",
                    TWP_TTFT_BEATEN, "ttft_p99", ("ttft_p99",)),
        lowest_claim(table, TWP, f"the lowest ITL coefficient of variation, as the paper's text states it (its ITL "
                     f"figure shows ServerlessLLM lower) ({condition})", "twp", "itl_cv", ".3f"),
        beats_claim(table, TWP, f"lower P99 end-to-end latency than ServerlessLLM and the conventional schedulers "
                    f"({condition})", "twp", TWP_BASELINES, "e2e_p99", ("e2e_p99",)),
        beats_claim(table, TWP, f"a lighter ITL tail (lower P99 ITL) than ServerlessLLM and the conventional "
                    f"schedulers ({condition})", "twp", TWP_BASELINES, "itl_p99", ("itl_p99",)),
    ]


UNKNOWN_LENGTH_ADDITIONS = ("mc-sf",)
"""Baselines the flow-control paper runs with known lengths only: servegym runs them with unknown lengths too, but
the paper's claims are not checked against them there."""


def as_the_paper_compares(table: Table) -> tuple[Table, dict[tuple[str, str], str]]:
    """Each grid's best variant per workload, MC-SF left out with unknown lengths, and the per-seed best measured
    latency added; also which variant each grid chose."""
    table, chosen = table.best_variants("e2e_mean_all_s")
    table = table.without(UNKNOWN_LENGTH_ADDITIONS, [w for w in table.workloads if w.endswith("/unknown")])
    return table.with_envelope(BEST_MEASURED, "e2e_mean_all_s"), chosen


def flow_claims(table: Table, setting: str) -> list[Claim]:
    table, chosen = as_the_paper_compares(table)
    grid = "; ".join(f"{w}: {v}" for (w, f), v in chosen.items() if f in ("flow-control", "alpha-protection"))
    suffix = f" [best of the grid per workload: {grid}]" if grid else ""
    claims = [
        beats_claim(table, FLOW, f"beats alpha-protection greedy, MC, MC-SF and A_min on latency ({setting})",
                    "flow-control", FLOW_BASELINES, "e2e_mean_all_s", FLOW_METRICS),
        beats_claim(table, FLOW, f"beats them on P95 latency ({setting})", "flow-control", FLOW_BASELINES,
                    "e2e_p95_all_s", FLOW_METRICS),
        near_claim(table, FLOW, f"comes near hindsight ({setting}; checked against the per-seed best measured, "
                   "the clairvoyant greedy packer included, which the optimum can only undercut)", "flow-control",
                   BEST_MEASURED, "e2e_mean_all_s", 0.10),
        beats_claim(table, FLOW, f"the throttle pays: flow control beats unthrottled FCFS admission on latency "
                    f"({setting}; servegym's check of the paper's premise)", "flow-control", ["fcfs"],
                    "e2e_mean_all_s", FLOW_METRICS),
        beats_claim(table, FLOW, f"higher token throughput than the baselines ({setting})", "flow-control",
                    FLOW_BASELINES, "throughput_tps", FLOW_METRICS, higher_is_better=True),
        beats_claim(table, FLOW, f"higher request throughput than the baselines ({setting})", "flow-control",
                    FLOW_BASELINES, "throughput_rps", FLOW_METRICS, higher_is_better=True),
        beats_claim(table, FLOW, f"more stable KV cache utilization than the baselines ({setting})",
                    "flow-control", FLOW_BASELINES, "kv_util_std", FLOW_METRICS),
    ]
    known = table.restricted([w for w in table.workloads if w.endswith("/known")])
    if "flow-control-per-class" in table.policies and known.workloads:
        claims.append(near_claim(known, FLOW, f"with per-class budgets b_k (known lengths) comes near hindsight "
                                 f"({setting}; against the per-seed best measured)", "flow-control-per-class",
                                 BEST_MEASURED, "e2e_mean_all_s", 0.10))
    return [Claim(c.paper, c.claim, c.measured + (suffix if i == 0 else ""), c.verdict, c.reason)
            for i, c in enumerate(claims)]


def latency_gap(table: Table, workload: str) -> tuple[str, Interval]:
    """Flow control's latency advantage over the strongest baseline of ``workload`` (the one with the lowest mean
    latency): the paired ``baseline / flow control - 1`` over seeds, > 0 when flow control is faster."""
    present = [b for b in FLOW_BASELINES if (workload, b, "e2e_mean_all_s") in table.values]
    best = min(present, key=lambda b: table.mean(workload, b, "e2e_mean_all_s")[0])
    return best, paired_ratio(table.cells(workload, best, "e2e_mean_all_s"),
                              table.cells(workload, "flow-control", "e2e_mean_all_s"))


def narrows_claim(synthetic: Table, real: Table, text: str) -> Claim:
    """"The gap narrows on real data": per length mode, flow control's advantage over the strongest baseline on the
    real-data workloads against every synthetic class's. Reproduced when the real CI lies wholly below every
    synthetic CI and above zero (narrower, still ahead); partly when it lies below them but reaches zero or below
    (the gap closes or reverses), or overlaps them; not reproduced when it lies wholly above one (wider)."""
    synthetic, _ = as_the_paper_compares(synthetic)
    real, _ = as_the_paper_compares(real)
    parts, verdicts = [], []
    for w in real.workloads:
        mode = w.rsplit("/", 1)[-1]
        theirs = [(s, *latency_gap(synthetic, s)) for s in synthetic.workloads if s.rsplit("/", 1)[-1] == mode]
        best, ours = latency_gap(real, w)
        if ours.high < min(ci.low for _, _, ci in theirs):
            verdict = REPRODUCED if ours.low > 0 else PARTLY
        else:
            verdict = NOT if ours.low > max(ci.high for _, _, ci in theirs) else PARTLY
        shown = ", ".join(f"{s} (vs {b}) {ci.describe('+.1%')}" for s, b, ci in theirs)
        parts.append(f"{w} (vs {best}) {ours.describe('+.1%')} against {shown}: {verdict}")
        verdicts.append(verdict)
    return combine_verdicts(FLOW, text, "; ".join(parts), verdicts,
                            "flow control's latency advantage over the strongest baseline, paired per seed within "
                            "each setting; the real-data CI must lie wholly below every synthetic class's and above "
                            "zero")


@dataclass(frozen=True)
class Setting:
    """One row of the claims: which experiment, the paper's claims it checks, and the words naming it."""

    experiment: str
    paper: str
    label: str
    workloads: str = ""
    """Only this experiment's workloads whose label starts with it (a demand level of one file); all when empty."""


SETTINGS = (
    Setting("twp_paper_warm", TWP, "warm pool, the paper's regime"),
    Setting("twp_paper", TWP, "cold pool"),
    Setting("twp_memory_bound", TWP, "memory-bound: KV memory limits the batch"),
    Setting("flow_control_synthetic", FLOW, "synthetic classes"),
    Setting("flow_control_synthetic_80", FLOW, "synthetic classes at 80% load, kept output"),
    Setting("flow_control_mixed", FLOW, "mixed classes"),
    Setting("flow_control_chat", FLOW, "chat trace, low demand", "chat-low"),
    Setting("flow_control_chat", FLOW, "chat trace, high demand", "chat-high"),
)
"""The report's settings, in its order."""
GAP_SETTINGS = ("flow_control_synthetic", "flow_control_chat", "chat-high")
""""The gap narrows on real data": the synthetic classes against the chat trace at the same load (95% of lambda*)."""


def _table(results: list[TaskResult], workloads: str) -> Table:
    table = Table(results)
    return table.restricted([w for w in table.workloads if w.startswith(workloads)]) if workloads else table


def regimes_table(claims: list[Claim], regimes: dict[str, str]) -> list[str]:
    """Flow control's settings side by side: each one's regime and the verdicts of the throttle and latency
    claims, so the report says where the paper's claim holds."""
    lines = ["| setting | regime (from its experiment file) | the throttle pays | beats the baselines on latency |",
             "|---|---|---|---|"]
    for setting in SETTINGS:
        if setting.paper != FLOW or setting.experiment not in regimes:
            continue
        mine = {c.claim.split(" (", 1)[0]: c.verdict for c in claims if c.claim.endswith(f"({setting.label})")
                or f"({setting.label};" in c.claim}
        throttle = mine.get("the throttle pays: flow control beats unthrottled FCFS admission on latency", "-")
        latency = mine.get("beats alpha-protection greedy, MC, MC-SF and A_min on latency", "-")
        lines.append(f"| {setting.label} | {regimes[setting.experiment]} | {throttle} | {latency} |")
    return lines


def render(claims: list[Claim], notes: list[str], sources: list[str], regimes: list[str] | None = None) -> str:
    lines = [
        "# Reproducing the two source papers with servegym",
        "",
        "Generated by `servegym reproduce` from the experiment files in `experiments/` (tables, tidy results "
        "and plots under `docs/results/<experiment>/`). Nothing in the environment was tuned toward the papers' "
        "numbers; the verdicts report what the simulator says.",
        "",
        "How verdicts are decided (`evaluation/verdicts.py`, `VERDICT_RULES`):",
        "",
        *[f"- {rule}" for rule in VERDICT_RULES],
        "",
        "| paper | claim | servegym measured | verdict |",
        "|---|---|---|---|",
    ]
    for c in claims:
        lines.append(f"| {c.paper} | {c.claim} | {c.measured} | **{c.verdict}** ({c.reason}) |")
    if regimes:
        lines += ["", "## Flow control's regimes side by side", "",
                  "Each experiment file states its regime before any result; where the throttle pays is a "
                  "property of the regime, so both sides are run and shown.", "", *regimes]
    lines += ["", "## Changes since the previous report", ""] + [f"- {c}" for c in CHANGES]
    lines += ["", "## Readings taken and caveats", ""] + [f"- {n}" for n in notes]
    lines += ["", "## Runs", ""] + [f"- {s}" for s in sources]
    return "\n".join(lines) + "\n"


def write_reproduction(results_by_experiment: dict[str, list[TaskResult]], seeds: dict[str, int],
                       path: Path, regimes: dict[str, str] | None = None) -> list[Claim]:
    """Score every claim on the experiments given (a missing one's claims are left out) and write the report;
    ``regimes``: each experiment file's stated regime (``Experiment.regime``)."""
    regimes = regimes or {}
    claims: list[Claim] = []
    for setting in SETTINGS:
        if setting.experiment not in results_by_experiment:
            continue
        table = _table(results_by_experiment[setting.experiment], setting.workloads)
        claims += (twp_claims if setting.paper == TWP else flow_claims)(table, setting.label)
    synthetic, real, level = GAP_SETTINGS
    if synthetic in results_by_experiment and real in results_by_experiment:
        claims.append(narrows_claim(Table(results_by_experiment[synthetic]),
                                    _table(results_by_experiment[real], level),
                                    "the gap narrows on real data: flow control's lead over the strongest baseline "
                                    "is smaller on the chat trace than on the synthetic classes (both at 95% of "
                                    "lambda*, restarts)"))
    sources = [f"`experiments/{name}.yaml`: {seeds[name]} seeds, {len(results)} runs; tables in "
               f"[`results/{name}/summary.md`](results/{name}/summary.md)"
               + (f". Regime: {regimes[name]}" if regimes.get(name) else "")
               for name, results in results_by_experiment.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(claims, NOTES, sources, regimes_table(claims, regimes)))
    return claims
