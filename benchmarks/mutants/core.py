"""Mutations of the compiled engine (``engine/_core.pyx``), each caught by the equivalence cases of
``tests/test_compiled_engine.py`` (the mutation audit rebuilds the scratch copy's extension for each)."""

COMPILED = "tests/test_compiled_engine.py"
CORE = "engine/_core.pyx"

MUTATIONS = [
    ("core-admit-token-load-ignores-generated", CORE,
     "self.token_load += self.hi[rid] - generated", "self.token_load += self.hi[rid]", (COMPILED,), "engine"),
    ("core-readmit-forgets-generated", CORE,
     "run[r, GEN] = generated", "run[r, GEN] = 0", (COMPILED,), "engine"),
    ("core-chunk-budget-counts-prefilling-rows", CORE,
     "budget = self.max_batched - (n - num_pre)", "budget = self.max_batched - n", (COMPILED,), "engine"),
    ("core-prefill-cap-ignored", CORE,
     "if self.max_prefill >= 0:", "if self.max_prefill >= 1 << 40:", (COMPILED,), "engine"),
    ("core-prefill-cap-off-by-one", CORE,
     "budget = min(budget, self.max_prefill)", "budget = min(budget, self.max_prefill + 1)", (COMPILED,), "engine"),
    ("core-countdown-not-lowered-by-new-decoders", CORE,
     "            self._finish_countdown = min(self._finish_countdown, run[row, OUT] - run[row, GEN])\n", "",
     (COMPILED,), "engine"),
    ("core-countdown-one-late", CORE,
     "        self._finish_countdown = left\n", "        self._finish_countdown = left + 1\n", (COMPILED,), "engine"),
    ("core-removal-frees-whole-blocks-only", CORE,
     "self.num_used_blocks -= _blocks(run[i, KV], self.block_size)",
     "self.num_used_blocks -= run[i, KV] // self.block_size", (COMPILED,), "engine"),
    ("core-removal-drops-last-column", CORE,
     "                for j in range(NUM_COLS):\n", "                for j in range(NUM_COLS - 1):\n", (COMPILED,),
     "engine"),
    ("core-idle-receive-keeps-clock", CORE,
     "        if self.clock < now:  # the engine sat idle until now\n            self.clock = now\n", "",
     (COMPILED,), "engine"),
    ("core-observe-waiting-clipped-to-window", CORE,
     "buf[6] = len(self.waiting)", "buf[6] = k", (COMPILED,), "engine"),
    ("core-kv-rate-sign-flipped", CORE,
     "((kv_free - self._kv_free_prev) - self.kv_free_delta)", "((self._kv_free_prev - kv_free) - self.kv_free_delta)",
     (COMPILED,), "engine"),
    ("core-kv-rate-observed-unsigned", CORE,
     "buf[8] = self.kv_free_delta", "buf[8] = abs(self.kv_free_delta)", (COMPILED,), "engine"),
]
