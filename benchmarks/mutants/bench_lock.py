"""Mutations of the benchmark's locked evaluation (issue 26): the test track runs exactly the task's settings,
engine-config rows stay apart, the normalized score and the paired difference to the best heuristic, and the
oracle that bounds the board."""

BENCH = "tests/test_bench.py"
ORACLE = "tests/test_oracle.py"

MUTATIONS = [
    ("bench-test-track-takes-overrides", "benchmark/bench.py",
     "apply_overrides=job.track == ENGINE_CONFIG_TRACK)", "apply_overrides=True)", (BENCH,), "bench"),
    ("bench-no-engine-config-track", "benchmark/bench.py",
     "return (ENGINE_CONFIG_TRACK,) if needs else (TEST_TRACK, ENGINE_CONFIG_TRACK)",
     "return (TEST_TRACK,)", (BENCH,), "bench"),
    ("bench-needs-ignored", "benchmark/bench.py",
     "return (ENGINE_CONFIG_TRACK,) if needs else (TEST_TRACK, ENGINE_CONFIG_TRACK)",
     "return (TEST_TRACK, ENGINE_CONFIG_TRACK)", (BENCH,), "bench"),
    ("bench-changed-compares-nothing", "benchmark/bench.py",
     "if getattr(before, k) != getattr(after, k)}", "if False}", (BENCH,), "bench"),
    ("leaderboard-engine-config-ranked", "benchmark/board.py",
     "    return label.endswith(ENGINE_CONFIG_SUFFIX)", "    return False", (BENCH,), "bench"),
    ("leaderboard-versus-unpaired", "benchmark/board.py",
     "return None if best is None else paired_difference(score.per_seed, best.per_seed)",
     "return None if best is None else paired_difference(score.per_seed, {-1: 0.0, **best.per_seed})",
     (BENCH,), "bench"),
]
MUTATIONS += [
    ("stats-iqm-drops-nothing", "evaluation/stats.py", "    cut = x.size // 4", "    cut = 0", (BENCH,), "bench"),
    ("stats-poi-ties-lose", "evaluation/stats.py", "return float(np.mean((diff > 0) + 0.5 * (diff == 0)))",
     "return float(np.mean(diff > 0))", (BENCH,), "bench"),
    ("leaderboard-lone-run-is-a-group", "benchmark/board.py",
     "return {name: runs for name, runs in groups.items() if len(runs) >= 2}",
     "return {name: runs for name, runs in groups.items() if len(runs) >= 1}", (BENCH,), "bench"),
    ("oracle-switches-to-a-worse-plan", "benchmark/oracle.py",
     "                if end > plan.total:", "                if end < plan.total:", (ORACLE,), "bench"),
    ("oracle-plans-from-the-first-base-only", "benchmark/oracle.py",
     "        if plan is None or total > plan.total:", "        if plan is None:", (ORACLE,), "bench"),
    ("oracle-skips-the-replay-check", "benchmark/oracle.py",
     "if step != len(plan.actions) or not done or total != plan.total:", "if False:", (ORACLE,), "bench"),
    ("oracle-bound-line-flipped", "benchmark/leaderboard.py",
     "and sign * (v - oracle.per_seed[k]) > 0]", "and sign * (v - oracle.per_seed[k]) < 0]", (ORACLE,), "bench"),
]
