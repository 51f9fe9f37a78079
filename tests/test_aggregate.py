"""The board's statistics (issue 51, item 5): Holm's step-down correction, the paired t-test behind every mark,
and rliable's across-task aggregates, each checked against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.benchmark.aggregate import SCORE_CLIP, across_tasks, clip_score, holm, paired_p_value
from servegym.benchmark.bench import BenchRow
from servegym.benchmark.leaderboard import aggregate_table, markdown


def test_paired_p_value_matches_the_closed_form_for_two_degrees_of_freedom():
    # With df = 2 the two-sided p of a t statistic is 1 - t / sqrt(t^2 + 2). Differences 1, 2, 6: mean 3,
    # sd sqrt(7), t = 3 / (sqrt(7) / sqrt(3)) = 1.964.
    t = 3 / (math.sqrt(7) / math.sqrt(3))
    assert paired_p_value([1.0, 2.0, 6.0]) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)
    assert paired_p_value([-1.0, -2.0, -6.0]) == paired_p_value([1.0, 2.0, 6.0])  # two-sided
    assert paired_p_value([2.0, 2.0, 2.0]) == 0.0 and paired_p_value([0.0, 0.0]) == 1.0
    assert math.isnan(paired_p_value([1.0])) and math.isnan(paired_p_value([1.0, math.nan]))


def test_holm_steps_down_with_a_running_maximum():
    # m = 4 tests: sorted 0.01, 0.02, 0.03, 0.04 -> 4 x 0.01 = 0.04, 3 x 0.02 = 0.06, 2 x 0.03 = 0.06 (0.06 kept),
    # 1 x 0.04 = 0.04 -> the running maximum 0.06. A NaN is no test: it stays NaN and m stays 4.
    adjusted = holm({"c": 0.03, "a": 0.01, "d": 0.04, "b": 0.02, "none": math.nan})
    assert adjusted["a"] == pytest.approx(0.04) and adjusted["b"] == pytest.approx(0.06)
    assert adjusted["c"] == pytest.approx(0.06) and adjusted["d"] == pytest.approx(0.06)
    assert math.isnan(adjusted["none"])
    assert holm({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}  # capped at 1


def test_holm_is_no_stricter_than_bonferroni_and_no_looser_than_unadjusted():
    rng = np.random.default_rng(0)
    p = {k: float(v) for k, v in enumerate(rng.random(20) ** 3)}
    adjusted = holm(p)
    assert all(p[k] <= adjusted[k] <= min(1.0, 20 * p[k]) + 1e-12 for k in p)


def test_scores_are_clipped_to_the_stated_range():
    assert SCORE_CLIP == (-100.0, 200.0)
    assert clip_score(-1732.0) == -100.0 and clip_score(250.0) == 200.0 and clip_score(42.0) == 42.0
    assert math.isnan(clip_score(math.nan))


def test_across_tasks_iqm_gap_and_profile_by_hand():
    # One policy, 4 seeds x 2 tasks, scores 0..100: the IQM drops the lowest and highest quarter of the 8 values
    # (2 each): sorted 10, 20, 40, 50, 60, 80, 90, 300->200 clipped; kept 40, 50, 60, 80 -> 57.5. The optimality
    # gap is the mean shortfall below 100 with scores capped at 100: (90 + 60 + 50 + 10 + 80 + 40 + 20 + 0) / 8.
    matrix = np.array([[10.0, 20.0], [40.0, 60.0], [50.0, 80.0], [90.0, 300.0]])
    stats = across_tasks({"p": matrix})["p"]
    assert stats["iqm"][0] == pytest.approx(57.5)
    assert stats["optimality_gap"][0] == pytest.approx(350 / 8)
    # Profile: the fraction of the 8 episodes above each score.
    assert stats["above_0"][0] == pytest.approx(1.0) and stats["above_50"][0] == pytest.approx(4 / 8)
    assert stats["above_90"][0] == pytest.approx(1 / 8) and stats["above_100"][0] == pytest.approx(1 / 8)
    low, high = stats["iqm"][1:]
    assert low <= 57.5 <= high and high - low > 0
    assert across_tasks({"p": matrix}) == across_tasks({"p": matrix})  # seeded: the same intervals
    # ...and a policy's intervals do not move when another policy joins the board.
    assert across_tasks({"a": matrix / 2, "p": matrix})["p"] == stats


def _rows(task: str, values: dict[str, list[float]]) -> list[BenchRow]:
    return [BenchRow(task, label, 900_000 + s, v, 1.0, 1.0, 1.0, 0, False, 10)
            for label, vs in values.items() for s, v in enumerate(vs)]


def test_the_aggregate_table_covers_policies_on_every_anchored_task():
    # Two tasks with anchors; twp ran on both, sarathi on one only (left out). On relaxed twp scores 50 on every
    # seed (random -200, oracle -100, twp -150); on memory-tight 0, 50, 100 (random -40, oracle -20).
    rows = [*_rows("relaxed", {"random": [-200.0] * 3, "oracle": [-100.0] * 3, "twp": [-150.0] * 3,
                               "sarathi": [-120.0] * 3}),
            *_rows("memory-tight", {"random": [-40.0] * 3, "oracle": [-20.0] * 3, "twp": [-40.0, -30.0, -20.0]})]
    from servegym.benchmark.board import boards

    table = "\n".join(aggregate_table(boards(rows)))
    assert "## Across tasks (relaxed, memory-tight)" in table and "over the first 3 test seeds" in table
    assert "| twp | 50.0 [" in table and "| sarathi |" not in table
    assert "| oracle | 100.0 [100.0, 100.0] | 0.0 [0.0, 0.0] |" in table
    assert "| random | 0.0 [0.0, 0.0] | 100.0 [100.0, 100.0] |" in table
    assert table.index("| oracle |") < table.index("| twp |") < table.index("| random |")  # best IQM first
    assert "## Across tasks" in markdown(rows)


def test_admission_and_routing_tasks_are_aggregated_apart():
    # Routers play only routing tasks and admission policies only admission tasks: one table over both would hold
    # only the oracle. Each decision gets its own table.
    from servegym.benchmark.board import boards

    rows = [*_rows("relaxed", {"random": [-200.0] * 3, "oracle": [-100.0] * 3, "twp": [-150.0] * 3}),
            *[BenchRow("cluster-routing", label, 900_000 + s, v, 1.0, 1.0, 1.0, 0, False, 10, 0.1)
              for label, v in (("router-round-robin", -90.0), ("oracle", -50.0), ("router-kv-aware", -60.0))
              for s in range(3)]]
    table = "\n".join(aggregate_table(boards(rows)))
    assert "## Across tasks (relaxed)" in table and "## Across tasks (cluster-routing)" in table
    admission, routing = table.split("## Across tasks (cluster-routing)")
    assert "| twp | 50.0 [" in admission and "| router-kv-aware | 75.0 [" in routing


def test_the_agent_table_gives_the_iqm_in_return_and_in_score_units():
    # Two training seeds x 3 test seeds: returns -150, -140, -130 and -170, -100, -160. IQM of the six drops the
    # lowest and highest one (6 // 4 = 1): mean(-160, -150, -140, -130) = -145; as a score (random -200 = 0,
    # oracle -100 = 100) 55. The best heuristic twp scores -145 on each seed: the agents beat it on 3 of 6
    # episodes (-140, -130, -100 do; -150, -170, -160 do not): 0.50.
    from servegym.benchmark.board import boards
    from servegym.benchmark.leaderboard import agent_table

    rows = [*_rows("relaxed", {"random": [-200.0] * 3, "oracle": [-100.0] * 3, "twp": [-145.0] * 3,
                               "rl:A__s0": [-150.0, -140.0, -130.0], "rl:A__s1": [-170.0, -100.0, -160.0]})]
    (board,) = boards(rows)
    line = next(x for x in agent_table(board) if x.startswith("| rl:A__s* |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "2" and cells[2].startswith("-145 [") and cells[3].startswith("55 [")
    low, high = (float(x) for x in cells[3].split("[")[1].rstrip("]").split(","))
    assert low <= 55 <= high and low < high  # the interval's ends in order
    assert cells[4].startswith("0.50 [")


def test_the_aggregate_normalizes_each_episode_against_the_anchors_on_its_seed():
    # Seed 0 is a light workload (random -100, oracle -50), seed 1 heavy (random -1000, oracle -500): twp at -75 and
    # -750 scores 50 on both seeds, paired; against the anchors' means (-550, -275) it would score 172.7 and -72.7.
    from servegym.benchmark.board import boards

    rows = [BenchRow("relaxed", label, 900_000 + s, v, 1.0, 1.0, 1.0, 0, False, 10)
            for label, values in (("random", (-100.0, -1000.0)), ("oracle", (-50.0, -500.0)), ("twp", (-75.0, -750.0)))
            for s, v in enumerate((*values, sum(values) / 2))]
    (board,) = boards(rows)
    twp = board.score("twp")
    assert [board.normalized_on_seed(twp, 900_000 + s) for s in range(3)] == pytest.approx([50.0, 50.0, 50.0])
    assert board.normalized_value(twp.per_seed[900_000]) == pytest.approx(100 * 475 / 275)
    assert "| twp | 50.0 [50.0, 50.0] |" in "\n".join(aggregate_table([board]))
