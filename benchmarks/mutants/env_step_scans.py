"""Mutations of the engine's helpers on the env's per-step path: the admission action's decoding
(``Engine.admit_order``, and ``ServingEnv._decode_action`` around it), the pool observation
(``Engine.observe_pool``) and the cold rule (``Engine.is_cold``)."""

SCANS = "tests/test_engine_scans.py"
BAD = "tests/test_bad_input.py"
PROPS = "tests/test_properties.py"
POOL = "tests/test_pool.py"
ORDER = "            while j > 0 and action[order[j - 1]] > value:"
RANGE = "            if value < 0 or value > width:"

MUTATIONS = [
    ("action-never-ordered", "engine/engine.py", ORDER, ORDER.replace("j > 0 and", "False and"),
     (SCANS, BAD, PROPS), "env"),
    ("action-ties-reordered", "engine/engine.py", ORDER, ORDER.replace("> value", ">= value"),
     (SCANS, BAD, PROPS), "env"),
    ("action-keeps-ranks-of-empty-slots", "engine/engine.py", "                beyond += 1\n                continue\n",
     "                beyond += 1\n", (SCANS, BAD, PROPS), "env"),
    ("action-keeps-the-first-empty-slot", "engine/engine.py", "            if k >= visible:\n",
     "            if k > visible:\n", (SCANS, BAD), "env"),
    ("action-miscounts-empty-slots", "envs/serving.py", "            self._invalid += beyond\n",
     "            self._invalid += beyond - 1\n", (BAD,), "env"),
    ("action-upper-bound-off-by-one", "engine/engine.py", RANGE, RANGE.replace("> width", "> width + 1"),
     (SCANS, BAD), "env"),
    ("action-width-out-of-range", "engine/engine.py", RANGE, RANGE.replace("> width", ">= width"), (SCANS, BAD),
     "env"),
    ("action-negative-rank-accepted", "engine/engine.py", RANGE, RANGE.replace("value < 0", "value < -1"),
     (SCANS, BAD), "env"),
    ("cold-at-the-keep-alive", "engine/engine.py",
     "and now - self.idle_since > keep_alive_s", "and now - self.idle_since >= keep_alive_s", (SCANS, POOL), "env"),
    ("pool-warmth-while-loading", "engine/engine.py", "                warmth = now - e.ready_at",
     "                warmth = e.ready_at - now", (SCANS, POOL), "env"),
    ("pool-idle-while-busy", "engine/engine.py",
     "            out[row + 2] = 0.0 if len(e.waiting) > 0 or e.num_running > 0 else now - e.idle_since",
     "            out[row + 2] = now - e.idle_since", (SCANS, POOL), "env"),
]
