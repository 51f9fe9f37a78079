"""How a reproduction verdict is decided: the rule, stated once in :data:`VERDICT_RULES` (the report prints it in
its header), and the claim builders that apply it to per-seed results (:class:`Table`). In short: a claim is
*reproduced* only when the whole 95% CI of the compared quantity supports it, against every baseline, and
baselines with identical per-seed results are counted once.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from servegym.evaluation.grid import TaskResult
from servegym.evaluation.stats import Interval, mean_ci, paired_difference, paired_ratio

REPRODUCED, PARTLY, NOT = "reproduced", "partly reproduced", "not reproduced"

VERDICT_RULES = [
    "Every comparison is a 95% CI on a per-seed paired difference or ratio (the same seed gives every policy the "
    "same requests); the verdict says when the two sides ran different seeds and the CI is unpaired.",
    "A claim about a range (\"within 10% of hindsight\", \"+45% throughput\") is *reproduced* only when the whole "
    "CI lies inside the range, *partly reproduced* when the CI straddles the range's edge, *not reproduced* when "
    "the whole CI lies outside it. A gain claim whose CI lies wholly above zero but below the claimed gain is "
    "*partly reproduced* (the direction holds, the size does not).",
    "A \"lowest\" claim is reproduced when the paired difference to every other policy excludes zero in the "
    "policy's favour, not reproduced when some other policy is lower with a CI that excludes zero, partly "
    "reproduced otherwise.",
    "A \"beats\" claim counts every (baseline, workload) pair: it is *reproduced* when the policy beats every "
    "pair with the whole paired-difference CI in its favour, *partly reproduced* when it beats more than half of "
    "the pairs and is significantly worse (the whole CI against it) in none, and *not reproduced* otherwise: one "
    "pair won does not outweigh pairs lost.",
    "Baselines with identical per-seed results in a workload on every metric the setting's claims compare (for "
    "example MC and MC-SF with unknown lengths) are one baseline there, named together (\"mc = mc-sf (identical "
    "per-seed results)\") and counted once.",
    "A claim checked per workload is reproduced when it holds in every workload, not reproduced when it fails "
    "outright in more than half of them, and partly reproduced otherwise.",
]
"""The verdict rule, stated once: the report's header prints it and the claim functions below implement it."""


def range_verdict(ci: Interval, low: float = -math.inf, high: float = math.inf) -> str:
    """Reproduced when the whole CI lies in ``[low, high]``, not reproduced when none of it does, partly when it
    straddles an edge (also when the CI is undefined)."""
    if ci.low >= low and ci.high <= high:
        return REPRODUCED
    if ci.high < low or ci.low > high:
        return NOT
    return PARTLY


def gain_verdict(ci: Interval, claimed: float) -> str:
    """A claimed relative gain: the range ``[claimed, inf)``, with a real but smaller gain (CI wholly above zero)
    partly reproduced."""
    verdict = range_verdict(ci, low=claimed)
    return PARTLY if verdict == NOT and ci.low > 0 else verdict


def within_verdict(ci: Interval, tolerance: float) -> str:
    """Within ``tolerance`` of a reference, for a relative excess (lower is better): the range
    ``(-inf, tolerance]``."""
    return range_verdict(ci, high=tolerance)


def _pairing(intervals: list[Interval]) -> str:
    unpaired = sum(not ci.paired for ci in intervals)
    return "paired per seed" if not unpaired else f"{unpaired} of {len(intervals)} unpaired (different seeds)"


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

    def cells(self, workload: str, policy: str, metric: str) -> dict[int, float]:
        """Per-seed values of one (workload, policy, metric)."""
        return self.values[(workload, policy, metric)]

    def identical(self, workload: str, a: str, b: str, metrics: tuple[str, ...]) -> bool:
        """Whether ``a`` and ``b`` have identical per-seed values of every one of ``metrics`` in ``workload``."""
        for m in metrics:
            if (workload, a, m) not in self.values or (workload, b, m) not in self.values:
                return False
            ca, cb = self.cells(workload, a, m), self.cells(workload, b, m)
            if ca.keys() != cb.keys() or not np.array_equal([ca[s] for s in sorted(ca)],
                                                            [cb[s] for s in sorted(cb)], equal_nan=True):
                return False
        return True

    def equivalence_groups(self, workload: str, policies: list[str], metrics: tuple[str, ...]) -> list[list[str]]:
        """``policies`` grouped by identical per-seed ``metrics`` in ``workload``, in their given order."""
        groups: list[list[str]] = []
        for p in policies:
            group = next((g for g in groups if self.identical(workload, g[0], p, metrics)), None)
            if group is None:
                groups.append([p])
            else:
                group.append(p)
        return groups

    def mean(self, workload: str, policy: str, metric: str) -> tuple[float, float]:
        return mean_ci(self.series(workload, policy, metric))

    def _copy(self, keep: Callable[[tuple[str, str, str]], bool] = lambda key: True,
              workloads: list[str] | None = None) -> Table:
        """A copy holding the cells whose (workload, policy, metric) key ``keep`` accepts, and ``workloads``
        (default: all of them)."""
        out = Table([])
        out.values.update({k: dict(v) for k, v in self.values.items() if keep(k)})
        out.workloads = list(self.workloads) if workloads is None else [w for w in self.workloads if w in workloads]
        out.policies = list(self.policies)
        return out

    def restricted(self, workloads: list[str]) -> Table:
        """A copy holding only ``workloads``."""
        return self._copy(lambda key: key[0] in workloads, workloads)

    def without(self, policies: tuple[str, ...], workloads: list[str]) -> Table:
        """A copy with ``policies``' values dropped in ``workloads`` (the rest kept as they are)."""
        return self._copy(lambda key: not (key[1] in policies and key[0] in workloads))

    def with_envelope(self, name: str, metric: str) -> Table:
        """A copy with one more policy, ``name``: per workload and seed, the lowest ``metric`` of every policy that
        ran that seed."""
        out = self._copy()
        for w in self.workloads:
            per_policy = [self.values[(w, p, metric)] for p in self.policies if (w, p, metric) in self.values]
            if per_policy:
                seeds = set.intersection(*(set(c) for c in per_policy))
                out.values[(w, name, metric)] = {s: min(c[s] for c in per_policy) for s in sorted(seeds)}
        out.policies.append(name)
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


def group_name(group: list[str]) -> str:
    """``mc = mc-sf (identical per-seed results)`` for a group of equivalent baselines, the name for one."""
    return group[0] if len(group) == 1 else " = ".join(group) + " (identical per-seed results)"


def gain_claim(table: Table, paper: str, text: str, policy: str, others: list[str], metric: str,
               claimed: float) -> Claim:
    """Relative gain of ``policy`` over the per-seed mean of ``others`` on ``metric`` (higher is better)."""
    parts, verdicts, intervals = [], [], []
    for w in table.workloads:
        theirs_cells = [table.cells(w, o, metric) for o in others]
        seeds = sorted(set.intersection(*(set(c) for c in theirs_cells)))
        theirs = {s: float(np.mean([c[s] for c in theirs_cells])) for s in seeds}
        empty = [s for s in seeds if theirs[s] <= 0.0]
        if empty:  # a baseline that served nothing leaves no ratio to take (a run cut off before any finished)
            parts.append(f"{w}: the baselines' {metric} is 0 on seed(s) {empty}, no gain to measure: {NOT}")
            verdicts.append(NOT)
            continue
        ci = paired_ratio(table.cells(w, policy, metric), theirs)
        verdict = gain_verdict(ci, claimed)
        parts.append(f"{w}: {ci.describe('+.0%')}: {verdict}")
        verdicts.append(verdict)
        intervals.append(ci)
    return combine_verdicts(paper, text, "; ".join(parts), verdicts,
                    f"gain's 95% CI vs claimed {claimed:+.0%}, {_pairing(intervals)}")


def lowest_claim(table: Table, paper: str, text: str, policy: str, metric: str, fmt: str) -> Claim:
    """``policy`` has the lowest ``metric``: the paired difference to each other policy, the least favourable
    shown."""
    parts, verdicts, intervals = [], [], []
    for w in table.workloads:
        diffs = {p: paired_difference(table.cells(w, p, metric), table.cells(w, policy, metric))
                 for p in table.policies if p != policy and (w, p, metric) in table.values}  # > 0: policy lower
        if any(ci.high < 0 for ci in diffs.values()):
            verdict = NOT
        elif all(ci.low > 0 for ci in diffs.values()):
            verdict = REPRODUCED
        else:
            verdict = PARTLY
        closest = min(diffs, key=lambda p: diffs[p].low)
        ours, half = table.mean(w, policy, metric)
        parts.append(f"{w}: {policy} {ours:{fmt}} ± {half:{fmt}}; {closest} − {policy} "
                     f"{diffs[closest].describe('+' + fmt)}: {verdict}")
        verdicts.append(verdict)
        intervals += diffs.values()
    return combine_verdicts(paper, text, "; ".join(parts), verdicts,
                    f"95% CI of the difference to every other policy, least favourable shown, {_pairing(intervals)}")


def every_pair_verdict(wins: int, losses: int, total: int) -> str:
    """\"X beats Y1..Yk\" over ``total`` (baseline, workload) pairs, of which X significantly wins ``wins`` and
    significantly loses ``losses``: reproduced when it wins all, partly when it wins more than half and loses
    none, not reproduced otherwise (no pairs at all: not reproduced)."""
    if total and wins == total:
        return REPRODUCED
    if 2 * wins > total and not losses:
        return PARTLY
    return NOT


def beats_claim(table: Table, paper: str, text: str, policy: str, baselines: list[str], metric: str,
                same_on: tuple[str, ...], higher_is_better: bool = False) -> Claim:
    """``policy`` better than each baseline on ``metric``; baselines identical on every metric of ``same_on`` (the
    metrics the setting's claims compare) are one baseline."""
    wins, losses, total, parts, intervals = 0, 0, 0, [], []
    sign = -1.0 if higher_is_better else 1.0
    for w in table.workloads:
        present = [b for b in baselines if (w, b, metric) in table.values]
        pairs = []
        for group in table.equivalence_groups(w, present, same_on):
            ci = paired_difference(table.cells(w, group[0], metric), table.cells(w, policy, metric))
            ci = Interval(sign * ci.mean, ci.half, ci.paired)  # > 0: policy better
            won, lost = ci.low > 0, ci.high < 0
            total, wins, losses = total + 1, wins + won, losses + lost
            intervals.append(ci)
            pairs.append(f"{group_name(group)} {ci.describe('+.3g')}"
                         f"{' (better)' if won else ' (worse)' if lost else ''}")
        parts.append(f"{w}: " + ", ".join(pairs))
    verdict = every_pair_verdict(wins, losses, total)
    better = "higher" if higher_is_better else "lower"
    return Claim(paper, text, f"better in {wins} and worse in {losses} of {total} (baseline, workload) pairs, "
                 "identical baselines counted once; policy's advantage per baseline: " + "; ".join(parts), verdict,
                 f"{better} mean {metric} with a 95% CI on the difference that excludes zero, {_pairing(intervals)}")


def near_claim(table: Table, paper: str, text: str, policy: str, reference: str, metric: str,
               tolerance: float) -> Claim:
    parts, verdicts, intervals = [], [], []
    for w in table.workloads:
        ci = paired_ratio(table.cells(w, policy, metric), table.cells(w, reference, metric))
        verdict = within_verdict(ci, tolerance)
        parts.append(f"{w}: {ci.describe('+.1%')} vs tolerance {tolerance:.0%}: {verdict}")
        verdicts.append(verdict)
        intervals.append(ci)
    return combine_verdicts(paper, text, "; ".join(parts), verdicts,
                    f"whole 95% CI of {metric} relative to {reference} within {tolerance:.0%}, {_pairing(intervals)}")


def combine_verdicts(paper: str, text: str, measured: str, verdicts: list[str], reason: str) -> Claim:
    """One claim from its per-workload verdicts: reproduced when every workload reproduces it, not reproduced when
    more than half fail outright, partly otherwise."""
    if all(v == REPRODUCED for v in verdicts):
        verdict = REPRODUCED
    elif verdicts.count(NOT) > len(verdicts) / 2:
        verdict = NOT
    else:
        verdict = PARTLY
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in (REPRODUCED, PARTLY, NOT) if verdicts.count(v))
    return Claim(paper, text, measured, verdict, f"{reason} ({counts} of {len(verdicts)} workloads)")
