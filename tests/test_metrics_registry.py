"""One metric registry: every metric declared once, and every table reads its header, format and direction."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from servegym.metrics import METRICS, metric
from servegym.metrics.registry import EPISODE_METRICS
from servegym.policies import make_policy
from servegym.runner import make_env, run_episode

ROOT = Path(__file__).resolve().parents[1]


def test_summarize_computes_exactly_the_declared_metrics() -> None:
    policy = make_policy("fcfs")
    summary = run_episode(make_env(policy, workload="low"), policy, seed=0).summary
    assert set(summary) == set(METRICS) - EPISODE_METRICS


def test_formats_scale_round_and_sign_by_hand() -> None:
    assert metric("itl_mean").format(0.01234) == "12.3"  # seconds shown as ms, one decimal
    assert metric("itl_p99").format(0.00005) == "0.1"
    assert metric("ttft_p99").format(1.23456) == "1.235"
    assert metric("queue_slope_rps").format(0.5) == "+0.500" and metric("queue_slope_rps").format(-0.5) == "-0.500"
    assert metric("num_finished").format(12.0) == "12"
    assert metric("goodput_rps").format(math.nan) == "n/a"


def test_directions() -> None:
    assert metric("goodput_rps").direction == "maximize" and metric("ttft_p99").direction == "minimize"
    assert metric("episode_return").higher_is_better and not metric("num_unfinished").higher_is_better
    with pytest.raises(ValueError, match="no direction"):
        _ = metric("makespan_s").direction
    with pytest.raises(KeyError, match="unknown metric 'ttft_p98'"):
        metric("ttft_p98")


def test_consumers_read_the_registry() -> None:
    from servegym.benchmark.board import HEADERS, LOWER_IS_BETTER
    from servegym.tuning.objectives import OBJECTIVES

    assert HEADERS[3] == metric("ttft_p99").header and LOWER_IS_BETTER["ttft_p99_s"]
    assert not LOWER_IS_BETTER["episode_return"] and LOWER_IS_BETTER["unfinished"]
    assert OBJECTIVES["pareto"].directions == ("maximize", "minimize", "minimize")


def test_no_header_is_written_outside_the_registry() -> None:
    sources = [p for p in ROOT.rglob("*.py") if not {".venv", "tests", "build", "mutants"} & set(p.parts)
               and p.name != "registry.py"]  # mutants/ quotes the code it changes
    texts = {p: p.read_text() for p in sources}
    distinctive = [m.header for m in METRICS.values() if " " in m.header or "(" in m.header]
    assert len(distinctive) > 15  # a string literal that starts with one of these is a second copy
    for header in distinctive:
        hits = [str(p.relative_to(ROOT)) for p, text in texts.items() if f'"{header}' in text or f"'{header}" in text]
        assert not hits, f"{header!r} is written in {hits}: read metric(name).header instead"


def test_a_percentiles_header_names_its_percentile() -> None:
    percentiles = [m for m in METRICS.values() if re.search(r"_p\d\d(_|$)", m.name)]
    assert len(percentiles) >= 8
    for m in percentiles:
        digits = re.search(r"_p(\d\d)", m.name).group(1)
        assert f"P{digits}" in m.header, m.name
