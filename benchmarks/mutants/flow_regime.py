"""Mutations of the flow-control regime (issue 25): the restart recompute, the sweep's verdict rule (interior best
budget, paired CI above zero) and the claims' scope (MC-SF out of unknown lengths, TWP's P99 rivals)."""

REGIME = "tests/test_flow_regime.py"
ENGINE = "tests/test_engine.py"
VERDICTS = "tests/test_verdicts.py"

MUTATIONS = [
    ("restart-keeps-output", "engine/engine.py",
     "keep: cython.bint = self._config.recompute is Recompute.KEEP_OUTPUT",
     "keep: cython.bint = True",
     (ENGINE,), "engine"),
    ("restart-always", "engine/engine.py",
     "keep: cython.bint = self._config.recompute is Recompute.KEEP_OUTPUT", "keep: cython.bint = False", (ENGINE,),
     "engine"),
    ("regime-bottom-edge-counts", "evaluation/regime.py",
     "return BUDGETS[0] < self.best_multiple < BUDGETS[-1]", "return BUDGETS[0] <= self.best_multiple < BUDGETS[-1]",
     (REGIME,), "verdict"),
    ("regime-top-edge-counts", "evaluation/regime.py",
     "return BUDGETS[0] < self.best_multiple < BUDGETS[-1]", "return BUDGETS[0] < self.best_multiple <= BUDGETS[-1]",
     (REGIME,), "verdict"),
    ("regime-pays-by-mean", "evaluation/regime.py",
     "return self.interior and self.advantage().low > 0", "return self.interior and self.advantage().mean > 0",
     (REGIME,), "verdict"),
    ("regime-bound-drops-half", "evaluation/regime.py",
     "return kv_tokens / (prompt * output + (output + output * output) / 2)",
     "return kv_tokens / (prompt * output + (output + output * output))", (REGIME,), "verdict"),
    ("regime-fcfs-clear-runs-lifo", "evaluation/regime.py",
     'clear = _experiment(cell, "clear_all",', 'clear = _experiment(cell, "lifo",', (REGIME,), "verdict"),
    ("claims-rank-by-finished-latency", "evaluation/reproduction.py",
     'table, chosen = table.best_variants("e2e_mean_all_s")', 'table, chosen = table.best_variants("e2e_mean")',
     (VERDICTS,), "verdict"),
    ("claims-envelope-highest", "evaluation/verdicts.py",
     "{s: min(c[s] for c in per_policy) for s in sorted(seeds)}",
     "{s: max(c[s] for c in per_policy) for s in sorted(seeds)}", (VERDICTS,), "verdict"),
    ("metrics-censored-p95-of-finished", "metrics/core.py",
     '"e2e_p95_all_s": float(np.percentile(censored, 95))',
     '"e2e_p95_all_s": float(np.percentile(e2e_latency(log), 95))', ("tests/test_pins_metrics.py",), "metric"),
    ("claims-mc-sf-kept-in-unknown", "evaluation/reproduction.py",
     'UNKNOWN_LENGTH_ADDITIONS = ("mc-sf",)', "UNKNOWN_LENGTH_ADDITIONS = ()", (VERDICTS,), "verdict"),
    ("claims-twp-p99-against-everyone", "evaluation/reproduction.py",
     'TWP_TTFT_BEATEN = ["round-robin", "dynamic-batch", "serverless-llm"]',
     'TWP_TTFT_BEATEN = ["round-robin", "dynamic-batch", "serverless-llm", "priority", "fcfs"]',
     (VERDICTS,), "verdict"),
]
