"""The leaderboard of a routing task: its floor is round-robin, and every router is compared with it seed by seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.benchmark.bench import BenchRow, Entry, entry_decision, make_jobs
from servegym.benchmark.board import boards
from servegym.benchmark.leaderboard import markdown, routing_table
from servegym.benchmark.oracle import FROZEN_BASES


def _rows(label: str, returns: list[float], hits: list[float], e2e: list[float]) -> list[BenchRow]:
    return [BenchRow("cluster-routing", label, seed, ret, 1.0, lat, 1.0, 0, False, 10, hit)
            for seed, (ret, hit, lat) in enumerate(zip(returns, hits, e2e, strict=True))]


ROWS = [*_rows("router-round-robin", [-100.0, -120.0, -90.0], [0.05, 0.06, 0.04], [10.0, 12.0, 9.0]),
        *_rows("router-kv-aware", [-80.0, -110.0, -60.0], [0.10, 0.16, 0.13], [8.0, 11.0, 6.0])]


def test_a_routing_task_scores_against_round_robin():
    """The score's 0 and the verdict's floors are round-robin on a routing task (FCFS does not play there): a
    board that looked for FCFS would show n/a and call every routing task undetermined."""
    board = boards(ROWS)[0]
    assert board.floors == ("router-round-robin", "router-round-robin")
    # 0 = round-robin, 100 = the oracle: without an oracle no score is defined; with one (-70 on average), kv-aware
    # (-83.33) scores 100 (-83.33 + 103.33) / (-70 + 103.33) = 60.
    assert math.isnan(board.normalized(board.score("router-kv-aware")))
    (anchored,) = boards([*ROWS, *_rows("oracle", [-70.0, -80.0, -60.0], [0.1] * 3, [5.0] * 3)])
    assert anchored.normalized(anchored.score("router-kv-aware")) == pytest.approx(60.0)
    assert anchored.normalized(anchored.score("router-round-robin")) == pytest.approx(0.0)
    # Mean returns -83.33 vs -103.33: a gain of 20/103.33 = 19.4% >= 15%.
    assert board.verdict == "decision-sensitive"


def test_routing_table_pairs_every_router_with_round_robin():
    """Per-seed differences by hand, t(2) = 4.303: hit +0.05, +0.10, +0.09 (mean 0.080, sd 0.0265, half-width
    0.066: [0.014, 0.146]); e2e -2, -1, -3 (mean -2, sd 1, half 2.48: [-4.48, 0.48]); return +20, +10, +30 (mean
    20, sd 10, half 24.8). The hit ratio's interval excludes 0, but its p-value (t = 5.23, two-sided p = 1 -
    t / sqrt(t^2 + 2) = 0.035 with 2 degrees of freedom) is the smallest of the board's 4 comparisons (the three
    columns and round-robin against the best heuristic), so Holm multiplies it by 4: 0.139, no mark. A table that
    paired the wrong seeds or base, or marked on the unadjusted interval, would differ."""
    board = boards(ROWS)[0]
    lines = routing_table(board, ROWS)
    row = next(line for line in lines if line.startswith("| router-kv-aware"))
    cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
    assert cells[0] == "+0.080 [0.014, 0.146]"
    t = 0.08 / (np.std([0.05, 0.10, 0.09], ddof=1) / 3**0.5)
    assert 4 * (1 - t / (t * t + 2) ** 0.5) == pytest.approx(0.139, abs=1e-3)
    # The same differences on 8 seeds (the three, repeated, and two more): p_Holm falls below 0.05, marked.
    many = [BenchRow("cluster-routing", r.policy, seed, r.episode_return, 1.0, r.e2e_mean_all_s, 1.0, 0, False, 10,
                     r.prefix_hit_ratio) for seed in range(8) for r in ROWS if r.seed == seed % 3]
    row = next(line for line in routing_table(boards(many)[0], many) if line.startswith("| router-kv-aware"))
    assert row.split("|")[2].strip().endswith("(better)")
    assert cells[1] == "-2.00 [-4.48, 0.48]"
    assert cells[2].startswith("+20") and "[-4.8" in cells[2] and "(" not in cells[2]
    assert "router-round-robin |" not in "\n".join(lines[4:])  # the base is not compared with itself
    assert "Versus `router-round-robin`" in markdown(ROWS)


def test_admission_tasks_have_no_routing_table():
    rows = [BenchRow("relaxed", "fcfs", 0, -1.0, 1.0, 1.0, 1.0, 0, False, 1)]
    assert routing_table(boards(rows)[0], rows) == []


def test_contestants_play_only_tasks_of_their_decision():
    """Routers play only routing tasks and admission policies only admission tasks; the oracle plays both (over
    the contestants of the task)."""
    entries = [Entry("fcfs", "fcfs"), Entry("router-least-loaded", "router-least-loaded"),
               Entry("oracle", "oracle")]
    assert [entry_decision(e) for e in entries] == ["admission", "route", None]
    jobs = make_jobs(["relaxed", "cluster-routing"], entries, seeds=[0], validation=())
    played = {(job.task, job.label) for job in jobs}
    assert played == {("relaxed", "fcfs"), ("relaxed", "oracle"), ("cluster-routing", "router-least-loaded"),
                      ("cluster-routing", "oracle")}
    oracle = next(job for job in jobs if job.task == "cluster-routing" and job.label == "oracle")
    # every router, whoever plays, and the frozen tuned kv-aware router
    assert [base.label for base in oracle.bases] == [*FROZEN_BASES["route"], "router-kv-aware (frozen tuned)"]
