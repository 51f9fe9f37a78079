"""The flow-control regime sweep (servegym flow-regime): its bound, its verdict rule and one real cell each way."""

from __future__ import annotations

import pytest

from servegym.evaluation.regime import (
    BUDGETS,
    FCFS_CLEAR,
    FCFS_LIFO,
    Cell,
    CellResult,
    budget_label,
    cell_tasks,
    markdown,
    necessary_bound,
    sweep,
)


def test_necessary_bound_is_memory_over_token_steps():
    # (l, o) = (10, 60): l o + (o + o^2) / 2 = 600 + 1830 = 2430 token-steps; 4096 / 2430 = 1.6856 per step.
    assert necessary_bound(4096, 10, 60) == pytest.approx(4096 / 2430, rel=1e-12)
    assert necessary_bound(1024, 10, 20) == pytest.approx(1024 / 410, rel=1e-12)


def _result(best: float, fcfs: list[float], best_latency: list[float]) -> CellResult:
    latency = {budget_label(m): {s: 100.0 for s in range(3)} for m in BUDGETS}
    latency[budget_label(best)] = dict(enumerate(best_latency))
    latency[FCFS_LIFO] = dict(enumerate(fcfs))
    latency[FCFS_CLEAR] = {s: 500.0 for s in range(3)}
    return CellResult(Cell(60, 0.95, 4096, "restart"), latency)


def test_throttle_pays_only_with_an_interior_best_and_a_ci_above_zero():
    # Paired FCFS - best: 10, 12, 11 -> mean 11, CI wholly above zero; best b = 1x is interior.
    pays = _result(1.0, [60.0, 62.0, 61.0], [50.0, 50.0, 50.0])
    assert pays.best_multiple == 1.0 and pays.interior
    assert pays.advantage().mean == pytest.approx(11.0) and pays.advantage().low > 0
    assert pays.pays
    # The same gain at the grid's top edge is a budget that never binds: no verdict for the throttle.
    edge = _result(BUDGETS[-1], [60.0, 62.0, 61.0], [50.0, 50.0, 50.0])
    assert not edge.interior and not edge.pays
    bottom = _result(BUDGETS[0], [60.0, 62.0, 61.0], [50.0, 50.0, 50.0])
    assert not bottom.interior and not bottom.pays
    # Paired differences -5, +20, +15: mean +10 but the CI crosses zero.
    noisy = _result(1.0, [45.0, 70.0, 65.0], [50.0, 50.0, 50.0])
    assert noisy.advantage().low < 0 < noisy.advantage().mean and not noisy.pays


def test_each_cell_runs_the_budget_grid_under_lifo_and_fcfs_under_both_rules():
    cell = Cell(40, 0.9, 1024, "restart")
    todo = cell_tasks(cell, seeds=2)
    assert len(todo) == (len(BUDGETS) + 2) * 2
    rules = {t.policy.title: t.engine["preemption"] for t in todo}
    assert rules[FCFS_LIFO] == "lifo" and rules[FCFS_CLEAR] == "clear_all"
    assert all(t.engine["recompute"] == "restart" and t.engine["num_kv_blocks"] == 1024 for t in todo)
    budgets = sorted({t.policy.params["activation_budget"] for t in todo if t.policy.name == "flow-control"})
    assert budgets == pytest.approx([m * 1024 / 1220 for m in BUDGETS])  # 10 x 40 + (40 + 1600) / 2 = 1220


def test_a_real_sweep_finds_the_throttle_where_restarts_overflow_and_not_at_light_load():
    # o = 20 at 95% of lambda* in 1,024 tokens: unthrottled admission overflows and every eviction loses its
    # progress, so a budget near lambda* beats it; at 70% with vLLM's recompute nothing overflows for long.
    heavy, light = Cell(20, 0.95, 1024, "restart"), Cell(20, 0.7, 1024, "keep_output")
    rows = sweep(seeds=5, workers=1, only=[heavy, light])
    assert rows[0].pays and rows[0].mean(FCFS_LIFO) > rows[0].mean(budget_label(rows[0].best_multiple))
    assert rows[0].mean(FCFS_CLEAR) > rows[0].mean(FCFS_LIFO)  # clear-all with restarts thrashes worst
    assert not rows[1].pays
    text = markdown(rows, seeds=5)
    assert f"**Throttle pays in 1 of 2 cells**: {heavy.label}." in text
    assert text.count("| **throttle pays** |") == 1


def test_fewer_than_three_seeds_give_no_verdict():
    rows = [_result(1.0, [60.0, 62.0, 61.0], [50.0, 50.0, 50.0])]
    text = markdown(rows, seeds=2)
    assert "**No verdict:**" in text and "| **throttle pays** |" not in text and "| undetermined |" in text
