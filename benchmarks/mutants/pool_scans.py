"""Mutations of the pool's per-iteration scans over its containers (``Engine.earliest`` and ``Engine.stalled``,
compiled with the engine, and ``Cluster.step``'s reuse of its scan when no arrival was delivered)."""

POOL = "tests/test_pool.py"
R48 = "tests/test_bite_round48_engine.py"
SKIP = "tests/test_decision_skip.py"

MUTATIONS = [
    ("pool-scan-reused-after-arrivals", "pool/cluster.py", "        if arrived:  # delivered",
     "        if False:  # delivered", (POOL, R48, SKIP), "pool"),
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

# The pool's own loop (``Cluster._skip_pool``): a run must end at the iteration after which the env would decide.
LOOP = "tests/test_pool_skip.py"
MUTATIONS += [
    ("pool-loop-past-an-arrival", "pool/cluster.py",
     "            if arrived or self._stalled(engines, self.time) or engines[self.deciding].can_admit():",
     "            if self._stalled(engines, self.time) or engines[self.deciding].can_admit():", (LOOP,), "pool"),
    ("pool-loop-past-an-admission", "pool/cluster.py",
     "            if arrived or self._stalled(engines, self.time) or engines[self.deciding].can_admit():",
     "            if arrived or self._stalled(engines, self.time):", (LOOP,), "pool"),
    ("pool-loop-past-the-limit", "pool/cluster.py",
     "        while len(outcomes) < limit and not self.done and not self.awaiting_route:",
     "        while len(outcomes) <= limit and not self.done and not self.awaiting_route:", (LOOP,), "pool"),
    ("pool-loop-past-a-route", "pool/cluster.py",
     "        while len(outcomes) < limit and not self.done and not self.awaiting_route:",
     "        while len(outcomes) < limit and not self.done:", (LOOP,), "pool"),
    ("pool-loop-drops-a-finish", "pool/cluster.py",
     "                finished[len(outcomes)] = engine.last_finished_ids",
     "                finished[len(outcomes) + 1] = engine.last_finished_ids", (LOOP,), "pool"),
    ("pool-loop-last-from-the-deciding", "pool/cluster.py",
     "        last = tuple.__new__(ClusterStep, (ran, outcomes[-1], arrived, rejected, accrued[-1]))",
     "        last = tuple.__new__(ClusterStep, (self.deciding, outcomes[-1], arrived, rejected, accrued[-1]))",
     (LOOP,), "pool"),
    ("pool-loop-started-when-it-ends", "pool/cluster.py", "            started.append(self.time)\n",
     "            started.append(self.time + 1e-9)\n", (LOOP,), "pool"),
]
