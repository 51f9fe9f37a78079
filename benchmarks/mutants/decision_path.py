"""Mutations of the decision path's cheaper reads: arrivals routed by a scan of the arrival times, and eviction's
duplicate check without ``np.unique`` (the action's decoding: ``env_step_scans.py``)."""

BAD_INPUT = "tests/test_bad_input.py"
PROPS = "tests/test_properties.py"
SKIP = "tests/test_decision_skip.py"
GOLDEN = "tests/test_golden.py"

MUTATIONS = [
    # ------------------------------------------------------------------ Cluster._route_arrivals
    ("arrival-at-the-clock-waits", "pool/cluster.py", "times[stop] <= now", "times[stop] < now",
     (SKIP, GOLDEN, PROPS), "engine"),
    ("arrivals-one-at-a-time", "pool/cluster.py",
     "        while stop < n and times[stop] <= now:", "        if stop < n and times[stop] <= now:",
     (SKIP, GOLDEN, PROPS), "engine"),
    ("next-arrival-is-the-last-routed", "pool/cluster.py", "return self._arrival_times[self._next_arrival] if",
     "return self._arrival_times[self._next_arrival - 1] if", (SKIP, GOLDEN), "engine"),
]
