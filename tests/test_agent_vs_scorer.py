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
