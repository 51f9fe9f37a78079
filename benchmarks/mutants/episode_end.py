"""Mutations of how an episode ends and how its requests are counted under agent routing (the audit of
2026-12-08): the step that ends an episode a route ended, nothing moving a truncated episode, a refused step booking
nothing, the observation of the deciding container in a mixed pool, and info counts that sum to the log's."""

ROUTERS = "tests/test_routers.py"
ENDS = (ROUTERS, "-k", "rejects_the_last")
TRUNCATED = (ROUTERS, "-k", "truncated_and_a_refused")
MIXED = (ROUTERS, "-k", "mixed_pool")
COUNTS = (ROUTERS, "-k", "agent_routed or rejects_the_last")

S = "envs/serving.py"
OBS = "envs/observation.py"
R = "envs/routing.py"

MUTATIONS = [
    ("end-step-repeats-after-termination", S, "        if self.cluster.done and not self._terminated:\n",
     "        if self.cluster.done:\n", ENDS, "episode end"),
    ("end-step-repeats-last-outcome", S, "**self._info(IDLE, self.cluster.deciding,",
     "**self._info(self.engine.last, self.cluster.deciding,", ENDS, "episode end"),
    ("route-after-truncation", S,
     "        self._require_not_truncated()\n        rejected, lag = self.cluster.route(container)\n",
     "        rejected, lag = self.cluster.route(container)\n", TRUNCATED, "episode end"),
    ("refused-step-books-invalid", S,
     "        self.cluster.require_routed()  # before the action is read: a refused step books nothing\n", "",
     TRUNCATED, "episode end"),
    ("mixed-pool-capacity-of-container-0", OBS, "self._capacities[deciding]", "self._capacities[0]", MIXED, "pool"),
    ("mixed-pool-baseline-of-container-0", OBS, "self._baselines[deciding]", "self._baselines[0]", MIXED, "pool"),
    ("routed-arrival-uncounted", S, "        self._routed += 1\n", "", COUNTS, "counts"),
    ("routed-rejection-uncounted", S, "        self._routed_rejected += rejected\n", "", COUNTS, "counts"),
    ("routed-counts-never-cleared", S,
     "        counts = self._routed, self._routed_rejected\n        self._routed = self._routed_rejected = 0\n",
     "        counts = self._routed, self._routed_rejected\n", COUNTS, "counts"),
    ("routing-step-keeps-last-counts", R, "                counts[key] += info[key]\n",
     "                counts[key] = info[key]\n", COUNTS, "counts"),
    ("routing-step-route-never-rejects", R,
     'counts["num_arrived"], counts["num_rejected"] = 1, cluster.num_rejected - rejected',
     'counts["num_arrived"], counts["num_rejected"] = 1, 0', COUNTS, "counts"),
]
