"""benchmarks/rl_speed.py's vec section: its summary over rounds is each mode's median and range, per column."""

from __future__ import annotations

from tests.conftest import load_benchmark


def test_the_rounds_summary_is_each_columns_median_and_range():
    script = load_benchmark("rl_speed")
    # Three rounds, skewed so that the mean (6.3, 10.0) differs from the median and each column's order differs.
    lines = script.ratio_summary({"admit": [(4.0, 9.0), (10.0, 14.0), (5.0, 7.0)], "score": [(3.0, 2.0)]})
    assert lines[2] == "| admit | 3 | 5.0x [4.0, 10.0] | 9.0x [7.0, 14.0] |"
    assert lines[3] == "| score | 1 | 3.0x [3.0, 3.0] | 2.0x [2.0, 2.0] |"
    assert len(lines) == 4
