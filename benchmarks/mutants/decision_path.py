"""Mutations of the decision path's cheaper reads: the action decoded from its admitted slots, arrivals routed by a
scan of the arrival times, and eviction's duplicate check without ``np.unique``."""

BAD_INPUT = "tests/test_bad_input.py"
PROPS = "tests/test_properties.py"
SKIP = "tests/test_decision_skip.py"
GOLDEN = "tests/test_golden.py"

MUTATIONS = [
    # ------------------------------------------------------------------ ServingEnv._decode_action
    ("action-never-ordered", "envs/serving.py", "return slots if lo == hi else", "return slots if lo <= hi else",
     (BAD_INPUT, PROPS), "env"),
    ("action-ties-reordered", "envs/serving.py", 'slots[values.argsort(kind="stable")]',
     "slots[(-values).argsort(kind=\"stable\")[::-1]]", (BAD_INPUT, PROPS), "env"),
    ("action-keeps-ranks-of-empty-slots", "envs/serving.py", "slots, values = slots[:cut], values[:cut]",
     "slots = slots[:cut]", (BAD_INPUT, PROPS), "env"),
    ("action-keeps-the-first-empty-slot", "envs/serving.py", "cut = int(slots.searchsorted(visible))",
     'cut = int(slots.searchsorted(visible, side="right"))', (BAD_INPUT,), "env"),
    ("action-miscounts-empty-slots", "envs/serving.py", "self._invalid += slots.size - cut",
     "self._invalid += slots.size - cut - 1", (BAD_INPUT,), "env"),
    ("action-upper-bound-off-by-one", "envs/serving.py", "if lo < 0 or hi > w:", "if lo < 0 or hi > w + 1:",
     (BAD_INPUT,), "env"),
    ("action-negative-rank-accepted", "envs/serving.py", "if lo < 0 or hi > w:", "if lo < -1 or hi > w:",
     (BAD_INPUT,), "env"),
    # ------------------------------------------------------------------ Cluster._route_arrivals
    ("arrival-at-the-clock-waits", "pool/cluster.py", "times[stop] <= now", "times[stop] < now",
     (SKIP, GOLDEN, PROPS), "engine"),
    ("arrivals-one-at-a-time", "pool/cluster.py",
     "        while stop < n and times[stop] <= now:", "        if stop < n and times[stop] <= now:",
     (SKIP, GOLDEN, PROPS), "engine"),
    ("next-arrival-is-the-last-routed", "pool/cluster.py", "return self._arrival_times[self._next_arrival] if",
     "return self._arrival_times[self._next_arrival - 1] if", (SKIP, GOLDEN), "engine"),
]
