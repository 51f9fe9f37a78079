"""Mutations of the engine's iteration (``engine/engine.py``, run interpreted in the scratch copy), each caught by
the golden replays, the hand-computed engine tests or the branch cases."""

CORE = "engine/engine.py"
ITERATION = ("tests/test_golden.py", "tests/test_bite_engine.py", "tests/test_bite_iteration.py",
             "tests/test_compiled_engine.py", "tests/test_engine.py")

MUTATIONS = [
    ("core-admit-token-load-ignores-generated", CORE,
     "self.token_load += self.hi[rid] - generated", "self.token_load += self.hi[rid]", ITERATION, "engine"),
    ("core-readmit-forgets-generated", CORE,
     "run[r, GEN] = generated", "run[r, GEN] = 0", ITERATION, "engine"),
    ("core-chunk-budget-counts-prefilling-rows", CORE,
     "budget = self.max_batched - (n - num_pre)", "budget = self.max_batched - n", ITERATION, "engine"),
    ("core-prefill-cap-ignored", CORE,
     "if self.max_prefill >= 0:", "if self.max_prefill >= 1 << 40:", ITERATION, "engine"),
    ("core-prefill-cap-off-by-one", CORE,
     "budget = min(budget, self.max_prefill)", "budget = min(budget, self.max_prefill + 1)", ITERATION, "engine"),
    ("core-countdown-one-late", CORE,
     "        self._finish_countdown = left\n", "        self._finish_countdown = left + 1\n", ITERATION, "engine"),
    ("core-removal-drops-last-column", CORE,
     "                for j in range(NUM_COLS):\n", "                for j in range(NUM_COLS - 1):\n", ITERATION,
     "engine"),
    ("core-idle-receive-keeps-clock", CORE,
     "        if self.clock < now:  # the engine sat idle until now\n            self.clock = now\n", "",
     ITERATION, "engine"),
    ("core-observe-waiting-clipped-to-window", CORE,
     "len(self.waiting), 1.0 - cython.cast", "k, 1.0 - cython.cast", ITERATION, "engine"),
    ("core-kv-rate-sign-flipped", CORE,
     "((kv_free - self._kv_free_prev) - self.kv_free_delta)", "((self._kv_free_prev - kv_free) - self.kv_free_delta)",
     ITERATION, "engine"),
    ("core-kv-rate-observed-unsigned", CORE,
     "self.kv_free_delta, capacity,", "abs(self.kv_free_delta), capacity,", ITERATION, "engine"),
    ("core-evict-takes-a-row-twice", CORE, "if duplicated or (rows.size", "if (rows.size", ITERATION, "engine"),
    ("core-evict-takes-a-negative-row", CORE, "not 0 <= ascending[0] <= ascending[-1]",
     "not -1 <= ascending[0] <= ascending[-1]", ITERATION, "engine"),
]
MUTATIONS += [
    ("engine-deleted-keeps-the-taken", "engine/engine.py", "        if marks[k] != gone:\n",
     "        if marks[k] == gone:\n", ("tests/test_engine.py", "tests/test_compiled_engine.py"), "engine"),
    ("engine-deletes-the-refused-too", "engine/engine.py", "                    marks[positions[k]] = 2\n",
     "                    marks[positions[k]] = 1\n", ("tests/test_engine.py", "tests/test_compiled_engine.py"),
     "engine"),
    ("engine-repeated-position-admitted", "engine/engine.py",
     "            if marks[pos]:\n                raise IndexError(f\"queue position {pos} given twice",
     "            if False:\n                raise IndexError(f\"queue position {pos} given twice",
     ("tests/test_compiled_engine.py",), "engine"),
    ("engine-evict-skips-the-checks-of-several-rows", "engine/engine.py",
     "        if rows.shape[0] == 1:  # every rule", "        if rows.shape[0] >= 1:  # every rule",
     ("tests/test_engine.py",), "engine"),
]
