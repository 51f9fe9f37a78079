"""Mutations of the serving runtimes (issue 28): the launch floor, the stated CPU tail, the custom all-reduce's
size limit, the per-request host cost at one request, the runtime's split of a batch of prompts, the legacy
runtime of files without one, and issue 28's coverage verdict (every prediction within the cited range widened by
the tolerance at both ends)."""

RUNTIMES = "tests/test_runtimes.py"

MUTATIONS = [
    ("launch-floor-added-not-maxed", "backends/token_model.py",
     "            total = cpu + self.launch_floor_s", "            total = total + self.launch_floor_s",
     (RUNTIMES,), "backend"),
    ("cpu-tail-ignored", "backends/token_model.py",
     "        if self.cpu_tail_s_per_row is not None and rows > self.cpu_rows[-1]:",
     "        if self.cpu_tail_s_per_row is not None and rows > 1e12:", (RUNTIMES,), "backend"),
    ("custom-allreduce-limit-flipped", "backends/runtimes.py",
     "        if message_bytes > self.max_bytes:", "        if message_bytes < self.max_bytes:", (RUNTIMES,),
     "backend"),
    ("per-row-knot-holds-first-value", "backends/build.py",
     "        envelope = np.concatenate(([envelope[0] - (batch[1] - 1) * per_row * 1e3], envelope))",
     "        envelope = np.concatenate(([envelope[0]], envelope))", (RUNTIMES,), "backend"),
    ("prefill-split-ceil", "backends/runtime_fit.py",
     "    per_iteration = max(1, max_batched_tokens // prompt)",
     "    per_iteration = max(1, -(-max_batched_tokens // prompt))",
     (RUNTIMES,), "backend"),
    ("legacy-runtime-is-default", "backends/runtimes.py",
     'LEGACY_RUNTIME = "eager"', 'LEGACY_RUNTIME = "cuda-graphs"', (RUNTIMES,), "backend"),
    ("coverage-tolerance-one-sided", "backends/runtime_fit.py",
     "low, high = min(self.measured_s) * (1 - TOLERANCE), max(self.measured_s) * (1 + TOLERANCE)",
     "low, high = min(self.measured_s), max(self.measured_s) * (1 + TOLERANCE)", (RUNTIMES, "-k", "cell"), "backend"),
    ("coverage-any-prediction", "backends/runtime_fit.py",
     "all(low <= p <= high for p in self.predicted_s)", "any(low <= p <= high for p in self.predicted_s)",
     (RUNTIMES, "-k", "cell"), "backend"),
    ("coverage-max-for-min", "backends/runtime_fit.py",
     "low, high = min(self.measured_s) * (1 - TOLERANCE)", "low, high = max(self.measured_s) * (1 - TOLERANCE)",
     (RUNTIMES, "-k", "cell"), "backend"),
]
