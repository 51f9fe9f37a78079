"""Mutations of calibration's schema-2 fit and fidelity's comparison (issue 32): the hold-out rule, the knots, the
per-row cost's tail, the standard errors, the seeds' averages and spreads, the ranking's noise test and order."""

FIT = "tests/test_calibration_fit.py"

MUTATIONS = [
    ("holdout-from-the-first-point", "backends/calibration_fit.py",
     "    held = {i for i in range(2, len(points), HOLDOUT_EVERY)}",
     "    held = {i for i in range(0, len(points), HOLDOUT_EVERY)}", (FIT,), "backend"),
    ("knots-without-single-prefills", "backends/calibration_fit.py",
     "    pure = [tokens for (rows, tokens), decode_only in shapes if (decode_only or rows == 1) and tokens > 1]",
     "    pure = [tokens for (rows, tokens), decode_only in shapes if (decode_only and rows == 1) and tokens > 1]",
     (FIT,), "backend"),
    ("cpu-tail-dropped", "backends/calibration_fit.py",
     "        cpu_tail_s_per_row=float(c1))", "        cpu_tail_s_per_row=None)", (FIT,), "backend"),
    ("fit-weights-absolute-error", "backends/calibration_fit.py",
     "    w = 1.0 / np.maximum(np.abs(y), 1e-9)", "    w = np.ones_like(y)", (FIT,), "backend"),
    ("kv-term-swapped-with-pairs", "backends/calibration_fit.py",
     '    names = {"cpu_s_per_step": 0, "cpu_s_per_row": 1, "kv_s_per_token": -2, "s_per_pair": -1}',
     '    names = {"cpu_s_per_step": 0, "cpu_s_per_row": 1, "kv_s_per_token": -1, "s_per_pair": -2}', (FIT,),
     "backend"),
    ("spread-over-min-not-mean", "evaluation/fidelity.py",
     "    spreads = [(max(r) - min(r)) / abs(m) for r, m in zip(real, seed_means, strict=True) if len(r) > 1 and m]",
     "    spreads = [(max(r) - min(r)) / min(r) for r, m in zip(real, seed_means, strict=True) if len(r) > 1 and m]",
     (FIT,), "evaluation"),
    ("spread-is-the-mean-not-median", "evaluation/fidelity.py",
     "                       float(np.median(spreads)) if spreads else math.nan, errors)",
     "                       float(np.mean(spreads)) if spreads else math.nan, errors)", (FIT,), "evaluation"),
    ("ranking-ignores-spread", "evaluation/fidelity.py",
     "            if abs(a.real - b.real) > noise:", "            if abs(a.real - b.real) > 0:", (FIT,), "evaluation"),
    ("ranking-ties-count-as-same", "evaluation/fidelity.py",
     "            and self.calibrated_difference != 0.0", "            and True", (FIT,), "evaluation"),
    ("scatter-releases-in-order", "backends/calibration_sweep.py",
     "        self.backend.release(rng.permutation(ids))", "        self.backend.release(ids)",
     ("tests/test_calibrate_cli.py",), "backend"),
    ("residual-forward-only-always", "evaluation/fidelity.py",
     "    if steps.count_host_time:\n        measured = measured + np.asarray(steps.overhead_s, dtype=float)",
     "    if False:\n        measured = measured + np.asarray(steps.overhead_s, dtype=float)", (FIT,), "evaluation"),
]
