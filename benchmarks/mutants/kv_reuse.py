"""Mutations of prefix caching (issue 49): matching, sharing, the free list's order, eviction, the host tier's
charge, the hit ratio, the observation, the prefix-aware policies and the trace's own ratio."""

PC = "tests/test_prefix_caching.py"
POL = "tests/test_prefix_policies.py"
REPLAY = "tests/test_prefix_trace_replay.py"
MOON = "tests/test_mooncake.py"

MUTATIONS = [
    ("pc-last-token-reused", "engine/prefix_cache.py", "    return min(prompt // unit, (target - 1) // unit)",
     "    return min(prompt // unit, target // unit)", (PC, POL), "engine"),
    ("pc-partial-unit-reused", "engine/prefix_cache.py", "    return min(prompt // unit, (target - 1) // unit)",
     "    return (target - 1) // unit", (PC, POL), "engine"),
    ("pc-free-head-first", "engine/prefix_cache.py", "        for key in reversed(self.held.pop(request, ())):",
     "        for key in self.held.pop(request, ()):", (PC,), "engine"),
    ("pc-evict-newest", "engine/prefix_cache.py", "            key, _ = self.free.popitem(last=False)",
     "            key, _ = self.free.popitem(last=True)", (PC,), "engine"),
    ("pc-evict-one-too-few", "engine/engine.py",
     "            cache.evict(_blocks(excess, cache.unit_blocks))",
     "            cache.evict(excess // cache.unit_blocks)", (PC,), "engine"),
    ("pc-shared-counted-twice", "engine/engine.py",
     "                    self.num_used_blocks += cache.held_units(run[i, REQ]) * cache.unit_blocks\n", "",
     (PC,), "engine"),
    ("pc-revived-not-counted", "engine/engine.py",
     "        self.num_used_blocks += (revived + loaded) * cache.unit_blocks",
     "        self.num_used_blocks += loaded * cache.unit_blocks", (PC,), "engine"),
    ("pc-host-load-free", "engine/engine.py",
     "            self.pending_load_s += loaded * cache.unit_tokens * self.host_load_s_per_token",
     "            self.pending_load_s += 0.0", (PC,), "engine"),
    ("pc-host-never-kept", "engine/prefix_cache.py", "            if self.host_units:\n                self.host[key]",
     "            if False:\n                self.host[key]", (PC,), "engine"),
    ("pc-register-past-duplicate", "engine/prefix_cache.py", "            if key in self.refs:\n                return",
     "            if key in self.refs:\n                continue", (PC,), "engine"),
    ("pc-cached-context-not-attended", "engine/engine.py", "        self.run[row, KV] = cached\n",
     "        self.run[row, KV] = 0\n", (PC,), "engine"),
    ("pc-hit-ratio-gpu-only", "metrics/core.py",
     '    return {"prefix_hit_ratio": (float(log.cached_gpu_tokens[admitted].sum()) + host) / prompt,',
     '    return {"prefix_hit_ratio": float(log.cached_gpu_tokens[admitted].sum()) / prompt,', (PC, REPLAY),
     "metrics"),
    ("pc-hit-counted-each-admission", "engine/engine.py",
     "        if self.admit_s[rid] != self.admit_s[rid]:  # NaN: its first admission is the one the hit ratio counts",
     "        if True:", (PC,), "engine"),
    ("pc-obs-host-free", "envs/observation.py", "        cache[0] = len(state.free) * state.unit_blocks",
     "        cache[0] = len(state.refs) * state.unit_blocks", (PC,), "env"),
    ("pc-obs-queue-cap-off", "engine/prefix_cache.py",
     "            gpu, host = _leading_run(chains[request], cacheable_units(tokens, tokens + int(generated[request]), "
     "unit),", "            gpu, host = _leading_run(chains[request], cacheable_units(tokens, tokens + 1, unit),",
     (PC,), "env"),
    ("lpm-shortest-match", "policies/lpm.py",
     '        order = np.argsort(-cached_tokens(obs, rows.shape[0]), kind="stable")',
     '        order = np.argsort(cached_tokens(obs, rows.shape[0]), kind="stable")', (POL,), "policy"),
    ("vllm-budgets-cached", "policies/vllm.py", "        target = prompt + generated - hit",
     "        target = prompt + generated", (POL,), "policy"),
    ("scorer-whole-prompt", "policies/scorer.py", "        prompt = prompt - cached_tokens(obs, rows.shape[0])",
     "        prompt = prompt", (POL,), "policy"),
    ("mcsf-whole-prompt", "policies/mc_sf.py", "            prompt = prompt - cached_tokens(obs, rows.shape[0])",
     "            prompt = prompt", (POL,), "policy"),
]

MUTATIONS += [
    ("moon-ratio-last-block-hits", "workloads/mooncake.py", "        limit = min(len(chain), (prompt - 1) // block)",
     "        limit = min(len(chain), prompt // block)", (MOON,), "workload"),
    ("moon-ratio-lru-head-first", "workloads/mooncake.py", "        for value in reversed(full):",
     "        for value in full:", (MOON,), "workload"),
    ("moon-session-split-ignored", "workloads/mooncake.py",
     "        inside |= (start >= end * lo) & ((start < end * hi) | (hi == 1.0))", "        inside |= start >= 0",
     (MOON,), "workload"),
    ("moon-shards-ignored", "workloads/mooncake.py",
     "            shard = full.session % self.shards == int(rng.integers(self.shards))",
     "            shard = full.session >= int(rng.integers(self.shards)) * 0", (MOON,), "workload"),
]
