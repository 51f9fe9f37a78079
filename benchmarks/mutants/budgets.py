"""Mutations of the board's training budgets and learning curves (issue 53): what an old run used, which heuristics
draw the lines, the table's presence and units."""

BUDGETS = "tests/test_budgets.py"

MUTATIONS = [
    ("budget-old-run-guess-flipped", "benchmark/budgets.py",
     'before = "subprocess" if n_envs > 1 else "dummy"', 'before = "dummy" if n_envs > 1 else "subprocess"',
     (BUDGETS,), "bench"),
    ("budget-curves-lines-from-every-heuristic", "benchmark/budgets.py",
     'if is_heuristic(label) and label.endswith("(tuned)"):', "if is_heuristic(label):", (BUDGETS,), "bench"),
    ("budget-curves-lines-from-test-episodes", "benchmark/budgets.py",
     "        if row.task == task and row.policy.endswith(VALIDATION_SUFFIX):", "        if row.task == task:",
     (BUDGETS,), "bench"),
    ("budget-table-dropped", "benchmark/bench.py", "    if budgets:\n        from servegym.benchmark.budgets",
     "    if False:\n        from servegym.benchmark.budgets", (BUDGETS,), "bench"),
    ("budget-rate-per-minute", "benchmark/budgets.py", 'rate = f"{b.timesteps / b.wall_s:,.0f}"',
     'rate = f"{b.timesteps / b.wall_s * 60:,.0f}"', (BUDGETS,), "bench"),
    ("budget-curves-without-agents-allowed", "servegym/cli_bench.py", "    if args.curves and not args.rl:",
     "    if False:", (BUDGETS,), "bench"),
    ("budget-curves-labels-dropped", "benchmark/budgets.py",
     "                            labels=[e.label for e in agents])", "                            labels=None)",
     (BUDGETS,), "bench"),
    ("budget-one-env-subprocess-kept", "benchmark/budgets.py",
     'vec_env = "native" if n_envs == 1 and "vec_env" in data else', 'vec_env = "native" if False else',
     (BUDGETS,), "bench"),
]
