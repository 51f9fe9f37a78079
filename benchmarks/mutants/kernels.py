"""Mutations of the compiled admission kernels (``policies/kernels.py``), run from their source as Python."""

KERNELS = "tests/test_kernels.py"
POLICIES = "tests/test_bite_policies.py"

MUTATIONS = [
    ("kernel-blocks-floored", "policies/kernels.py", "used += (tokens + block - 1) // block",
     "used += tokens // block", (KERNELS,), "policy"),
    ("kernel-cached-blocks-rounded-up", "policies/kernels.py",
     "- cython.cast(cython.longlong, hits[k]) // block",
     "- (cython.cast(cython.longlong, hits[k]) + block - 1) // block", (KERNELS,), "policy"),
    ("kernel-cache-hits-ignored", "policies/kernels.py",
     "- cython.cast(cython.longlong, hits[k]) // block", "- 0", (KERNELS,), "policy"),
    ("kernel-slots-not-capped", "policies/kernels.py", "if count == slots or used > budget_blocks:",
     "if used > budget_blocks:", (KERNELS, POLICIES), "policy"),
    ("kernel-left-read-by-position", "policies/kernels.py", "scratch[2, k] = left[order[k]]",
     "scratch[2, k] = left[k]", (KERNELS,), "policy"),
    ("kernel-candidates-in-queue-order", "policies/kernels.py",
     "        row = order[k] * Q_WIDTH\n        scratch[1, k]", "        row = k * Q_WIDTH\n        scratch[1, k]",
     (KERNELS,), "policy"),
    ("kernel-fused-skips-feasibility", "policies/kernels.py",
     "    if fit == 0:\n        return 0\n", "    if fit >= 0:\n        return fit\n", (KERNELS,), "policy"),
    ("kernel-running-recompute-ignored", "policies/kernels.py",
     "scratch[0, k] = running[row + R_PROMPT] + running[row + R_GEN]", "scratch[0, k] = running[row + R_PROMPT]",
     (KERNELS,), "policy"),
    ("kernel-slack-per-request-off-by-one", "policies/kernels.py", "slack * (num_run + k + 1)",
     "slack * (num_run + k)", (KERNELS, POLICIES), "memory-aware"),
]
