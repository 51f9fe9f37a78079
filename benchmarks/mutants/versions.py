"""Mutations of Serving-v1's held-out data and truncation charge (issue 26): test windows inside the held-out
spans, training windows outside them, the split chosen per task, v1's charge."""

VERSIONS = "tests/test_versions.py"

MUTATIONS = [
    ("split-test-uses-train-workload", "envs/tasks.py",
     'return self.test_workload if split == "test" and self.test_workload else self.workload',
     "return self.workload", (VERSIONS,), "env"),
    ("split-v1-is-legacy", "envs/mixture.py",
     "settings = spec.env_kwargs(split, version)", "settings = spec.env_kwargs(None, version)",
     (VERSIONS,), "env"),
    ("window-ignores-span-end", "workloads/trace.py",
     "            latest = max(first, last - width)", "            latest = max(first, last)",
     (VERSIONS,), "workload"),
    ("window-span-start-zero", "workloads/trace.py",
     "            begin = float(rng.uniform(first, latest)) if latest > first else first",
     "            begin = float(rng.uniform(0.0, latest)) if latest > first else first", (VERSIONS,), "workload"),
    ("window-first-span-only", "workloads/trace.py",
     "            pick = int(rng.choice(len(bounds), p=room / room.sum())) if len(bounds) > 1 else 0",
     "            pick = 0", (VERSIONS,), "workload"),
    ("v1-charges-v0", "envs/mixture.py",
     "V1_TRUNCATION_PENALTY_S = 600.0", "V1_TRUNCATION_PENALTY_S = 60.0", (VERSIONS,), "env"),
]
