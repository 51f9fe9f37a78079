"""Mutations of the pool's per-iteration scans over its containers (``Engine.earliest`` and ``Engine.stalled``,
compiled with the engine, and ``Cluster.step``'s reuse of its scan when no arrival was delivered)."""

POOL = "tests/test_pool.py"
R48 = "tests/test_bite_round48_engine.py"
SKIP = "tests/test_decision_skip.py"

MUTATIONS = [
    ("pool-scan-reused-after-arrivals", "pool/cluster.py", "            if arrived:  # delivered",
     "            if False:  # delivered", (POOL, R48, SKIP), "pool"),
    ("pool-done-with-arrivals-left", "pool/cluster.py",
     "self.done = not busy and self._next_arrival >= self._num_requests", "self.done = not busy",
     (POOL, R48, SKIP), "pool"),
    ("pool-clock-from-an-idle-container", "pool/cluster.py",
     "self.time = max(old_time, clock if busy else engine.clock)", "self.time = max(old_time, engine.clock)",
     (POOL, R48, SKIP), "pool"),
    ("stalled-while-loading", "engine/engine.py",
     "            if e.num_running > 0 or now < e.ready_at < math.inf:\n",
     "            if e.num_running > 0:\n", (POOL, SKIP), "env"),
    ("stalled-while-another-runs", "engine/engine.py",
     "            if e.num_running > 0 or now < e.ready_at < math.inf:\n                return False\n",
     "            if e.num_running > 0 or now < e.ready_at < math.inf:\n                continue\n",
     (POOL, SKIP), "env"),
]
