"""benchmarks/agent_vs_scorer.py's per-episode measures, in the order its table reads them."""

from __future__ import annotations

import numpy as np

from tests.conftest import load_benchmark
from tests.test_oracle_vs_agents import small_log


def test_episode_measures_are_request_seconds_by_prompt_quartile_then_wait_service_preemptions_recomputation():
    log = small_log()  # request-seconds 3.0, 3.0, 2.0, 0, 0 (wait 0.5, 1, 2; service 2.5, 2); prompts 100-9000
    log.num_preemptions[1] = 2
    measures = load_benchmark("agent_vs_scorer").episode_measures(log, [50.0, 150.0, 250.0])
    # <= 50: request 3 (0); 50-150: request 0 (3.0); 150-250: request 1 (3.0); > 250: requests 2 and 4 (2.0).
    np.testing.assert_array_equal(measures, [0.0, 3.0, 3.0, 2.0, 3.5, 4.5, 2.0, 200.0])


def test_state_lines_say_the_scorers_outcome_of_the_agent_by_kv_use_and_queue():
    """Bugs: the scorer's "more" (it admits more than the agent) read as the agent admitting more; a decision put
    in the wrong KV or queue bucket. One decision at 30% KV use with 2 waiting where the scorer admits more (the
    agent fewer), one at 95% with 20 waiting where they agree."""
    avs = load_benchmark("agent_vs_scorer")
    ova = load_benchmark("oracle_vs_agents")
    lines = avs.state_lines([ova.Decision(0.3, 2, {avs.SCORER: "more"}), ova.Decision(0.95, 20, {avs.SCORER: "same"})])
    header = "| KV blocks in use | decision steps | as the scorer | agent admits more | agent admits fewer | other |"
    assert lines[0].strip() == header
    assert "| ≤ 50% | 1 | 0.0% | 0.0% | 100.0% | 0.0% |" in lines
    assert "| > 90% | 1 | 100.0% | 0.0% | 0.0% | 0.0% |" in lines
    assert "| 2-4 | 1 | 0.0% | 0.0% | 100.0% | 0.0% |" in lines
    assert "| > 16 | 1 | 100.0% | 0.0% | 0.0% | 0.0% |" in lines
    assert "| 1 | 0 | - | - | - | - |" in lines  # no decision with 1 waiting
