"""Mutations of the board's statistics (issue 51, items 4-5): fixed anchors, the best heuristic chosen on validation
seeds, Holm's step-down correction, the paired t-test, clipped scores and the across-task aggregates."""

AGG = "tests/test_aggregate.py"
BENCH = "tests/test_bench.py"
ORACLE = "tests/test_oracle.py"
ROUTING = "tests/test_routing_board.py"

MUTATIONS = [
    ("holm-factor-off-by-one", "benchmark/aggregate.py",
     "running = max(running, min(1.0, (m - i) * p))", "running = max(running, min(1.0, (m - i - 1) * p))",
     (AGG,), "bench"),
    ("holm-no-running-max", "benchmark/aggregate.py",
     "running = max(running, min(1.0, (m - i) * p))", "running = min(1.0, (m - i) * p)", (AGG,), "bench"),
    ("holm-no-cap", "benchmark/aggregate.py",
     "running = max(running, min(1.0, (m - i) * p))", "running = max(running, (m - i) * p)", (AGG,), "bench"),
    ("p-value-one-sided", "benchmark/aggregate.py",
     "return float(2.0 * stats.t.sf(abs(t), df=x.size - 1))", "return float(stats.t.sf(abs(t), df=x.size - 1))",
     (AGG,), "bench"),
    ("p-value-population-sd", "benchmark/aggregate.py", "sd = x.std(ddof=1)", "sd = x.std(ddof=0)", (AGG,),
     "bench"),
    ("mark-ignores-holm", "benchmark/leaderboard.py", "or p_holm >= ALPHA or", "or p_holm >= 1.0 or", (BENCH, ROUTING),
     "bench"),
    ("clip-upper-bound-lost", "benchmark/aggregate.py", "SCORE_CLIP = (-100.0, 200.0)",
     "SCORE_CLIP = (-100.0, 1e9)", (AGG,), "bench"),
    ("profile-at-or-above", "benchmark/aggregate.py", "*((sample > tau / 100.0).mean()",
     "*((sample >= tau / 100.0).mean()", (AGG,), "bench"),
    ("anchor-zero-is-fcfs", "benchmark/board.py", "return self.score(self.floors[0]), self.score(ORACLE)",
     "return self.score(self.floors[1]), self.score(ORACLE)", (BENCH, ORACLE), "bench"),
    ("best-heuristic-from-test-seeds", "benchmark/board.py",
     "        for candidate in self.validation:", "        for candidate in ():", (BENCH,), "bench"),
    ("validation-on-test-split", "benchmark/bench.py",
     'split = "train" if job.track == VALIDATION_TRACK else "test"', 'split = "test"', (BENCH,), "bench"),
    ("oracle-bases-are-contestants", "benchmark/bench.py",
     "        bases = tuple(Entry(label, policy, params) for label, policy, params in frozen_bases(task, decision))",
     "        bases = tuple(e for e, _ in runs if e.policy != ORACLE)", (ORACLE,), "bench"),
]

MUTATIONS += [
    ("aggregate-mixes-decisions", "benchmark/leaderboard.py",
     "                    if get_task(b.task).decision == decision and all(a is not None for a in b.anchors)]",
     "                    if all(a is not None for a in b.anchors)]", (AGG,), "bench"),
    ("agent-score-iqm-unsorted-ends", "benchmark/leaderboard.py",
     "        ends = sorted(board.normalized_value(v) for v in (low, high))",
     "        ends = [board.normalized_value(v) for v in (high, low)]", (AGG,), "bench"),
]

MUTATIONS += [
    ("aggregate-unpaired-anchors", "benchmark/leaderboard.py",
     "columns.append([b.normalized_on_seed(b.score(policy), s) for s in sorted(per_seed)[:n]])",
     "columns.append([b.normalized_value(per_seed[s]) for s in sorted(per_seed)[:n]])", (AGG,), "bench"),
]

MUTATIONS += [
    ("oracle-frozen-tuned-dropped", "benchmark/oracle.py",
     "    return tuple((name, name, {}) for name in FROZEN_BASES[decision]) + tuned",
     "    return tuple((name, name, {}) for name in FROZEN_BASES[decision])", (ORACLE,), "bench"),
]
