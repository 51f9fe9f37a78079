"""Mutations of the benchmark scripts' own measuring code (what a figure in docs/ is computed by)."""

PARTS = "tests/test_step_parts.py"
SPEED = "tests/test_rl_speed.py"

MUTATIONS = [
    ("step-parts-engine-timer-counts-the-engines-own-loop", "benchmarks/step_parts.py",
     '_timed_attr(engine, "step", spent, "engine", within=in_pool_step)',
     '_timed_attr(engine, "step", spent, "engine")',
     (PARTS,), "bench"),
    ("rl-speed-rounds-summary-mean-for-median", "benchmarks/rl_speed.py",
     'cells = [f"{np.median(col):.1f}x', 'cells = [f"{np.mean(col):.1f}x', (SPEED,), "bench"),
    ("rl-speed-rounds-summary-range-swapped", "benchmarks/rl_speed.py",
     '[{min(col):.1f}, {max(col):.1f}]', '[{max(col):.1f}, {min(col):.1f}]', (SPEED,), "bench"),
]
