"""Mutations of independent test episodes (issue 51): trace tasks' test episodes are disjoint tiles of the held-out
data, the seed naming the tile; each task reports on as many seeds as its held-out data holds tiles; Serving-v1 keeps
its random windows."""

EPISODES = "tests/test_test_episodes.py"

MUTATIONS = [
    ("tiles-overlap", "workloads/trace.py",
     "            begin = float(full.arrival_s[-1]) * self.spans[0][0] + tile * width",
     "            begin = float(full.arrival_s[-1]) * self.spans[0][0] + tile * width / 2", (EPISODES,), "workload"),
    ("tile-start-one-tile-late", "workloads/trace.py",
     "            begin = float(full.arrival_s[-1]) * self.spans[0][0] + tile * width",
     "            begin = float(full.arrival_s[-1]) * self.spans[0][0] + (tile + 1) * width", (EPISODES,), "workload"),
    ("tile-count-rounds-up", "workloads/trace.py",
     "        return int(end * (hi - lo) // (self.duration_s / self.time_scale))",
     "        return int(end * (hi - lo) // (self.duration_s / self.time_scale)) + 1", (EPISODES,), "workload"),
    ("tile-drawn-not-seeded", "workloads/trace.py",
     "    return int(seq.entropy) % count if fresh else int(rng.integers(count))",
     "    return int(rng.integers(count))", (EPISODES,), "workload"),
    ("tile-seed-read-off-a-used-generator", "workloads/trace.py",
     "             and np.random.PCG64(seq).state == bits.state)",
     "             and True)", (EPISODES,), "workload"),
    ("sharded-tile-ignores-shard", "workloads/mooncake.py",
     "            tile, replica = divmod(episode_tile(rng, self.num_tiles()), self.shards)",
     "            tile, replica = episode_tile(rng, self.num_tiles()) // self.shards, 0",
     (EPISODES,), "workload"),
    ("v2-held-out-reaches-training", "workloads/scenarios.py",
     "V2_TEST_SPANS = ((0.325, 0.675),)", "V2_TEST_SPANS = ((0.3, 0.675),)", (EPISODES,), "workload"),
    ("trace-task-seeds-outnumber-tiles", "envs/tasks.py",
     "TILED_TEST_SEEDS = TEST_SEEDS[:10]", "TILED_TEST_SEEDS = TEST_SEEDS[:11]", (EPISODES,), "env"),
    ("mixture-replays-a-tile-twice", "envs/tasks.py",
     "if seed not in (900_016, 900_017, 900_021))", "if seed not in (900_017, 900_021))", (EPISODES,), "env"),
    ("v1-gets-v2-workloads", "envs/tasks.py",
     "            return self.v1_workloads[SPLITS.index(split)]", "            return self.workload",
     (EPISODES,), "env"),
    ("v2-gets-v1-workloads", "envs/tasks.py",
     "        if version == 1 and self.v1_workloads:", "        if version >= 1 and self.v1_workloads:",
     (EPISODES,), "env"),
]
