"""Mutations of the column-wise decision skip (``Cluster.skip``'s ``SkipRun`` and ``ServingEnv._account_run``),
the vLLM-style budget read from the observation once, and servegym's side of the Vidur benchmark.

Left out as equivalent: dropping ``_account_run``'s ``self._num_stalled = 0`` (the engine's loop only starts with rows
running, so the iteration booked before it already reset the count) and reading every running-table row's prefill
left in ``budget_after_running`` (the encoder zeroes the rows past ``num_running``, and zeros are not prefilling)."""

SKIP = "tests/test_decision_skip.py"
PINS = "tests/test_pins_policies.py"
PIN_METRICS = "tests/test_pins_metrics.py"
TASKS = "tests/test_tasks.py"
GOLDEN = "tests/test_golden.py"
BASELINES = "tests/test_baselines.py"
SIDE = "tests/test_vs_vidur_inputs.py"
SKIP_RUN = "tests/test_skip_run.py"

MUTATIONS = [
    # ------------------------------------------------------------------ Cluster.skip (SkipRun)
    ("run-started-at-its-end", "pool/cluster.py", "started.append(time)", "started.append(end)",
     (SKIP, SKIP_RUN), "engine"),
    ("run-last-is-its-first", "pool/cluster.py", "(0, outcomes[-1], arrived, rejected, accrued[-1])",
     "(0, outcomes[0], arrived, rejected, accrued[-1])", (SKIP, SKIP_RUN), "engine"),
    ("run-last-swaps-arrived-and-rejected", "pool/cluster.py", "(0, outcomes[-1], arrived, rejected,",
     "(0, outcomes[-1], rejected, arrived,", (SKIP, SKIP_RUN, PIN_METRICS), "engine"),
    ("run-clock-from-step-time", "pool/cluster.py", "end = max(time, row[0])", "end = max(time, row[1])",
     (SKIP, SKIP_RUN), "engine"),
    ("run-keeps-the-pools-count", "pool/cluster.py", "self.time, self._num_in_system = time, in_system",
     "self.time = time", (SKIP, SKIP_RUN), "engine"),
    ("run-lag-on-its-first", "pool/cluster.py", "        accrued[-1] += lag\n", "        accrued[0] += lag\n",
     (SKIP, SKIP_RUN), "engine"),
    ("run-never-done", "pool/cluster.py", "        self._update_done()\n        return SkipRun",
     "        return SkipRun", (SKIP, SKIP_RUN), "engine"),
    # ------------------------------------------------------------------ ServingEnv.step / _account_run
    ("run-books-its-last-twice", "envs/serving.py", "outcomes = run.outcomes[:-1]", "outcomes = run.outcomes[:]",
     (SKIP, SKIP_RUN), "env"),
    ("run-charges-its-last-twice", "envs/serving.py", "self._rewards(outcomes, run.latency_accrued_s[:-1],",
     "self._rewards(outcomes, run.latency_accrued_s,", (SKIP, SKIP_RUN, TASKS, PIN_METRICS), "env"),
    ("run-books-a-finish-at-its-last", "envs/serving.py", "if i < len(outcomes):", "if i <= len(outcomes):",
     (SKIP, SKIP_RUN, TASKS, PIN_METRICS), "env"),
    ("run-forgets-slo-good", "envs/serving.py",
     "                self._num_slo_good += good\n                if self.reward_name not in",
     "                if self.reward_name not in", (SKIP, SKIP_RUN, TASKS, PIN_METRICS), "env"),
    ("tokens-reward-takes-slo", "envs/serving.py", 'if self.reward_name not in ("latency", "tokens"):',
     'if self.reward_name != "latency":', (SKIP, SKIP_RUN), "env"),
    ("tokens-reward-counts-prefill", "envs/serving.py", "values = [float(outcome.num_decode_tokens)",
     "values = [float(outcome.num_prefill_tokens)", (SKIP, SKIP_RUN), "env"),
    ("run-books-no-preemptions", "envs/serving.py",
     "self._book_preemptions(sum(outcome.num_preemptions for outcome in outcomes))", "self._book_preemptions(0)",
     (SKIP, SKIP_RUN, "tests/test_make_args.py"), "env"),
    ("run-last-started-at-the-first", "envs/serving.py", "started_s, step = run.started_s[-1], run.last",
     "started_s, step = run.started_s[0], run.last", (SKIP, SKIP_RUN), "env"),
    ("step-sums-no-rejections", "envs/serving.py", "            rejected += step.rejected\n",
     "            rejected += 0\n", (SKIP, SKIP_RUN, PIN_METRICS), "env"),
    ("step-sums-from-three-iterations", "envs/serving.py", "if len(rewards) > 1:", "if len(rewards) > 2:",
     (SKIP, SKIP_RUN), "env"),
    # ------------------------------------------------------------------ vLLM-style budget, read once
    ("vllm-ongoing-chunk-is-a-block", "policies/vllm.py", "np.minimum(prefilling, engine[_CHUNK])",
     "np.minimum(prefilling, engine[_BLOCK])", (PINS, BASELINES, GOLDEN), "policy"),
    ("vllm-admits-past-free-slots", "policies/vllm.py", "rows = visible_queue(obs, engine)[: free_slots(obs, engine)]",
     "rows = visible_queue(obs, engine)", (PINS, BASELINES, GOLDEN), "policy"),
    ("reads-empty-queue-rows", "policies/common.py",
     "return min(int(engine[_WAITING]), obs[\"queue\"].shape[0] // _WIDTH)",
     "return obs[\"queue\"].shape[0] // _WIDTH", (PINS, BASELINES, GOLDEN), "policy"),
    ("free-blocks-floored", "policies/common.py",
     "return round(engine[_FREE] * engine[_CAPACITY] / engine[_BLOCK])",
     "return int(engine[_FREE] * engine[_CAPACITY] / engine[_BLOCK])", (PINS, BASELINES, GOLDEN), "policy"),
    ("vllm-recompute-ignored", "policies/vllm.py", "target = prompt + generated", "target = prompt",
     (PINS, BASELINES, GOLDEN), "policy"),
    ("vllm-blocks-never-spent", "policies/vllm.py", "        blocks -= need\n", "", (PINS, BASELINES, GOLDEN),
     "policy"),
    # ------------------------------------------------------------------ vs_vidur_servegym.py
    ("side-e2e-from-first-token", "benchmarks/vs_vidur_servegym.py", "e2e = log.finish_s - log.arrival_s",
     "e2e = log.finish_s - log.first_token_s", (SIDE,), "benchmark"),
    ("side-kv-tokens-in-blocks", "benchmarks/vs_vidur_servegym.py", "int(log.num_kv_blocks * log.block_size)",
     "int(log.num_kv_blocks)", (SIDE,), "benchmark"),
    ("side-inherits-no-bytecode", "benchmarks/vs_vidur.py", 'if k != "PYTHONDONTWRITEBYTECODE"}',
     'if k != "PYTHONDONTWRITEBYTECODE_"}', (SIDE,), "benchmark"),
    ("side-counts-decode-iterations-only", "benchmarks/vs_vidur_servegym.py",
     'STEP_INDEX["num_decode_tokens"]] + steps[:, STEP_INDEX["num_prefill_tokens"]]',
     'STEP_INDEX["num_decode_tokens"]]', (SIDE,), "benchmark"),
]
