"""The benchmark: tasks' test tracks, the oracle, the statistics, submissions and provenance (``servegym bench``).

Start at :func:`~servegym.benchmark.bench.run_bench` (what ``servegym bench`` runs), then, by what you look for:

* :mod:`~servegym.benchmark.bench`: the contestants (:class:`Entry`), the episodes (a task's test track on its
  test seeds, a policy's own engine settings in the engine-config track), ``leaderboard.csv``;
* :mod:`~servegym.benchmark.leaderboard`: each task's table, its fixed anchors, its paired comparisons and marks;
* :mod:`~servegym.benchmark.aggregate`: Holm's correction over the board and the across-task aggregates (rliable);
* :mod:`~servegym.benchmark.oracle`: the rollout planner over a frozen base set, the best found, not the optimum;
* :mod:`~servegym.benchmark.submission`: submitting an agent and verifying a submission;
* :mod:`~servegym.benchmark.provenance`: what made a result, and whether it may be ranked;
* :mod:`~servegym.benchmark.headroom`: whether a scenario's decisions matter at all.

The tasks themselves (settings, seed splits) are :mod:`servegym.envs.tasks`; the general statistics (mean CIs,
paired differences) :mod:`servegym.evaluation.stats`.
"""

from servegym.benchmark.bench import (
    DEFAULT_POLICIES,
    BenchRow,
    Entry,
    make_entries,
    read_leaderboard,
    run_bench,
    write_leaderboard,
)

__all__ = ["DEFAULT_POLICIES", "BenchRow", "Entry", "make_entries", "read_leaderboard", "run_bench",
           "write_leaderboard"]
