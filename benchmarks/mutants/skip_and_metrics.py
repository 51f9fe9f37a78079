"""Mutations of the decision skip (issue 29), the metric registry and the leaderboard's directions (issue 30)."""

SKIP = "tests/test_decision_skip.py"
REGISTRY = "tests/test_metrics_registry.py"

MUTATIONS = [
    ("skip-with-one-slot-left", "envs/serving.py",
     "e.num_running < self.engine_config.max_num_seqs \\", "e.num_running < self.engine_config.max_num_seqs - 1 \\",
     (SKIP,), "env"),
    ("skip-past-the-iteration-limit", "envs/serving.py",
     "or (self.iteration_limit is not None and self._num_steps >= self.iteration_limit)",
     "or (self.iteration_limit is not None and self._num_steps > self.iteration_limit)", (SKIP,), "env"),
    ("limit-counts-steps", "servegym/runner.py",
     "        if serving_env(self.env).num_steps >= self.max_iterations:",
     "        if serving_env(self.env).num_steps > self.max_iterations:", (SKIP,), "runner"),
    ("counts-columns-swapped", "envs/serving.py",
     '           "num_finished", "num_arrived", "num_rejected")',
     '           "num_arrived", "num_finished", "num_rejected")', (SKIP,), "env"),
    ("return-summed-per-step", "servegym/runner.py",
     '        for r in info.get("iteration_rewards", (reward,)):', '        for r in (reward,):', (SKIP,), "runner"),
    ("twp-declared-stateless", "policies/twp.py", '    name = "twp"\n', '    name = "twp"\n    stateless = True\n',
     (SKIP,), "policies"),
    ("itl-shown-in-seconds", "metrics/registry.py",
     '"mean gap between consecutive output tokens", scale=1e3)', '"mean gap between consecutive output tokens")',
     (REGISTRY,), "metrics"),
    ("unfinished-higher-is-better", "metrics/registry.py",
     'Metric("num_unfinished", "unfinished", "", 0, False,', 'Metric("num_unfinished", "unfinished", "", 0, True,',
     (REGISTRY,), "metrics"),
    ("ttft-p99-header-says-p95", "metrics/registry.py",
     'Metric("ttft_p99", "TTFT P99 (s)"', 'Metric("ttft_p99", "TTFT P95 (s)"', (REGISTRY,), "metrics"),
]
