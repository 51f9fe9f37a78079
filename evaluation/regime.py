"""Where does a throttle pay? The flow-control regime sweep (``servegym flow-regime``).

The flow-control paper's claims need a regime in which admitting every request that fits overflows the KV cache
and the overflow costs something. This sweep looks for it in discrete time (the paper's model: the
``discrete-time`` profile, 1 s per step, no batch cost, blocks of one token) over

- the class ``(l, o)`` = (10, 20), (10, 40), (10, 60), one class per run, as the paper's synthetic experiment;
- the load, as a fraction of the necessary stability bound ``lambda* = M / (l o + (o + o^2) / 2)``;
- the KV memory ``M``;
- what an eviction costs (``EngineConfig.recompute``): ``keep_output`` (vLLM: the evicted request keeps its
  generated tokens and re-ingests them in one prefill) or ``restart`` (the scheduling papers' model: its
  progress is lost and it regenerates every token);
- the unthrottled baseline's overflow rule: FCFS (admit in arrival order while the prompt fits in free KV) with
  LIFO eviction, which is flow control without its budget ("unthrottled greedy"), and with clear-all (every
  running request evicted at once, as alpha-protection greedy does).

Flow control (FIFO admission, LIFO eviction) runs over a budget grid of multiples of ``lambda*``. A cell's verdict
is *throttle pays* when the best budget is interior to the grid and the paired 95% CI of FCFS-with-LIFO minus the
best budget's latency lies wholly above zero. The best budget is picked on the same seeds it is scored on, so the
verdict is optimistic for the throttle by that selection; the interior condition keeps an edge of the grid (a
budget so large it never binds, that is FCFS) from counting.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from servegym.evaluation.executor import PROCESSES, RunStore, progress_bar, run_stored
from servegym.evaluation.grid import Task, TaskResult, describe, run_task, tasks
from servegym.evaluation.spec import Experiment, PolicySpec, WorkloadSpec
from servegym.evaluation.stats import MIN_VERDICT_SEEDS, Interval, paired_difference
from servegym.validation import count

PROMPT_TOKENS = 10
OUTPUTS = (20, 40, 60)
LOADS = (0.7, 0.8, 0.9, 0.95)
"""Arrival rate as a fraction of the necessary stability bound ``lambda*`` (1 is unstable for any policy)."""
MEMORIES = (1024, 4096)
RECOMPUTES = ("keep_output", "restart")
BUDGETS = (0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)
"""Flow control's budget grid, as multiples of ``lambda*`` (the sufficient condition suggests 0.9)."""
DURATION_S = 400.0
MAX_STEPS = 4000
METRIC = "e2e_mean_all_s"
"""Mean latency over every arrived request, the unfinished counted to the episode's end (truncation-fair)."""
FCFS_LIFO, FCFS_CLEAR = "fcfs (lifo)", "fcfs (clear-all)"


def necessary_bound(kv_tokens: int, prompt: int, output: int) -> float:
    """``lambda* = M / (l o + (o + o^2) / 2)``: the most requests per step any policy can keep stable."""
    return kv_tokens / (prompt * output + (output + output * output) / 2)


@dataclass(frozen=True)
class Cell:
    output: int
    load: float
    kv_tokens: int
    recompute: str

    @property
    def label(self) -> str:
        return f"o{self.output}-load{self.load:g}-M{self.kv_tokens}-{self.recompute}"

    @property
    def bound(self) -> float:
        return necessary_bound(self.kv_tokens, PROMPT_TOKENS, self.output)


def budget_label(multiple: float) -> str:
    return f"flow-control b={multiple:g}x"


def _experiment(cell: Cell, preemption: str, policies: tuple[PolicySpec, ...], seeds: int) -> Experiment:
    workload = WorkloadSpec(cell.label, {
        "arrivals": {"kind": "poisson", "rate": cell.load * cell.bound}, "duration_s": DURATION_S,
        "prompt": {"kind": "fixed", "value": PROMPT_TOKENS}, "output": {"kind": "fixed", "value": cell.output}})
    engine = {"num_kv_blocks": cell.kv_tokens, "block_size": 1, "max_num_seqs": 512,
              "max_num_batched_tokens": max(cell.kv_tokens, 512), "prefill_chunk_tokens": max(cell.kv_tokens, 512),
              "max_tokens": 128, "length_mode": "unknown", "preemption": preemption, "recompute": cell.recompute}
    return Experiment(name=f"flow-regime-{cell.label}-{preemption}", policies=policies, workloads=(workload,),
                      seeds=tuple(range(seeds)), profile="discrete-time", engine=engine, max_steps=MAX_STEPS)


def cell_tasks(cell: Cell, seeds: int) -> list[Task]:
    throttled = tuple(PolicySpec("flow-control", {"activation_budget": m * cell.bound}, budget_label(m))
                      for m in BUDGETS)
    lifo = _experiment(cell, "lifo", (*throttled, PolicySpec("fcfs", label=FCFS_LIFO)), seeds)
    clear = _experiment(cell, "clear_all", (PolicySpec("fcfs", label=FCFS_CLEAR),), seeds)
    return tasks(lifo) + tasks(clear)


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    latency: dict[str, dict[int, float]]
    """policy label -> seed -> :data:`METRIC`."""

    @property
    def best_multiple(self) -> float:
        return min(BUDGETS, key=lambda m: np.mean(list(self.latency[budget_label(m)].values())))

    @property
    def interior(self) -> bool:
        return BUDGETS[0] < self.best_multiple < BUDGETS[-1]

    def advantage(self) -> Interval:
        """FCFS with LIFO minus the best budget, per seed: positive when the throttle is faster."""
        return paired_difference(self.latency[FCFS_LIFO], self.latency[budget_label(self.best_multiple)])

    @property
    def pays(self) -> bool:
        return self.interior and self.advantage().low > 0

    def mean(self, label: str) -> float:
        return float(np.mean(list(self.latency[label].values())))


def cells() -> list[Cell]:
    return [Cell(o, load, m, r) for r in RECOMPUTES for m in MEMORIES for o in OUTPUTS for load in LOADS]


def sweep(seeds: int = 5, workers: int | None = None, progress: bool = False,
          only: list[Cell] | None = None, store: RunStore | None = None) -> list[CellResult]:
    """Run every cell's FCFS (both rules) and budget grid over ``seeds`` seeds, in parallel worker processes.

    With a ``store``, runs it holds are not run again and each new one is kept as it finishes, so a stopped sweep
    resumes where it stopped."""
    count("seeds", seeds, "seeds")
    chosen = only if only is not None else cells()
    todo = [task for cell in chosen for task in cell_tasks(cell, seeds)]
    bar = progress_bar(len(todo), "flow-regime", "run") if progress else None
    results: list[TaskResult] = run_stored(_run_quietly, todo, workers, store, describe, bar, PROCESSES)
    by_cell: dict[str, dict[str, dict[int, float]]] = {}
    for r in results:
        by_cell.setdefault(r.workload, {}).setdefault(r.policy, {})[r.seed] = r.metrics[METRIC]
    return [CellResult(cell, by_cell[cell.label]) for cell in chosen]


def _run_quietly(task: Task) -> TaskResult:
    """:func:`run_task` without the env's thrashing warning: this sweep looks for thrashing on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*thrashing the KV cache", category=RuntimeWarning)
        return run_task(task)



def markdown(rows: list[CellResult], seeds: int) -> str:
    judged = seeds >= MIN_VERDICT_SEEDS
    lines = [
        "# Where a throttle pays: the flow-control regime sweep",
        "",
        f"Generated by `servegym flow-regime --seeds {seeds}` (do not edit by hand; `evaluation/regime.py` states "
        "the sweep). Discrete time (1 s per step, no batch cost), one class (l, o) with l = 10 per run, Poisson "
        f"arrivals for {DURATION_S:.0f} steps, unknown output lengths, episodes capped at {MAX_STEPS:,} steps. "
        "Latency is the mean over every arrived request, the unfinished counted to the episode's end (steps). "
        "Load is the arrival rate over the necessary bound lambda* = M / (l o + (o + o^2)/2). *recompute* is what "
        "an eviction costs: `keep_output` (vLLM: the generated tokens are kept and re-ingested in one prefill "
        "step) or `restart` (the scheduling papers' model: the request's progress is lost). FCFS (lifo) is "
        "unthrottled greedy admission with flow control's own LIFO eviction; FCFS (clear-all) evicts every "
        f"running request on overflow. Flow control's b grid is {', '.join(f'{m:g}' for m in BUDGETS)} x lambda*. "
        "*Advantage* is FCFS (lifo) minus the best b, paired per seed (95% CI); **throttle pays** when that CI "
        "lies wholly above zero and the best b is interior to the grid. The best b is picked on the seeds it is "
        "scored on (optimistic for the throttle by that selection).",
        "",
    ]
    if not judged:
        lines += [f"**No verdict:** {seeds} seeds, fewer than the {MIN_VERDICT_SEEDS} a verdict needs.", ""]
    pays = [r for r in rows if r.pays]
    lines += [f"**Throttle pays in {len(pays)} of {len(rows)} cells**"
              + (f": {', '.join(r.cell.label for r in pays)}." if pays else ".") if judged else "", "",
              "| recompute | M | o | load | lambda* | FCFS (lifo) | FCFS (clear-all) | best b | best b latency "
              "| advantage over FCFS (lifo) | verdict |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c, adv = r.cell, r.advantage()
        best = budget_label(r.best_multiple)
        edge = "" if r.interior else " (grid edge)"
        verdict = ("**throttle pays**" if r.pays else "no") if judged else "undetermined"
        lines.append(
            f"| {c.recompute} | {c.kv_tokens} | {c.output} | {c.load:g} | {c.bound:.3g} | {r.mean(FCFS_LIFO):.1f} | "
            f"{r.mean(FCFS_CLEAR):.1f} | {r.best_multiple:g}x = {r.best_multiple * c.bound:.3g}{edge} | "
            f"{r.mean(best):.1f} | {_fmt(adv)} | {verdict} |")
    return "\n".join(lines) + "\n"


def _fmt(interval: Interval) -> str:
    if math.isnan(interval.half):
        return f"{interval.mean:+.1f}"
    return interval.describe("+.1f")
