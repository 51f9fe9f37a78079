"""Mutation check: apply small, realistic slips to the source one at a time and see whether the tests catch them.

Each mutation replaces one exact piece of text (which must occur exactly once in its file) in a scratch copy of
the repository, runs the tests that pin that behaviour, and counts the mutation *caught* when they fail.
The working tree is never modified.

    python benchmarks/mutation.py              # run every mutation, print caught/survived and the score
    python benchmarks/mutation.py --list       # list the mutations and their target tests
    python benchmarks/mutation.py --check      # only verify that every mutation's text still occurs exactly once
    python benchmarks/mutation.py --only ID    # run some (repeat --only, or give a comma-separated list)
    python benchmarks/mutation.py --jobs 2     # run in parallel scratch copies

The scratch copy imports its own code: the package is installed in editable mode with a package-dir mapping
(``servegym.engine`` lives in ``engine/``...), so the script links each mapped folder into the copy's
``servegym/`` package and runs pytest from the copy, where ``servegym`` resolves to the copy before the
editable finder is consulted; it checks that before running anything. Hypothesis runs derandomized
(``SERVEGYM_MUTATION=1``) so that a score is reproducible. Exit status: 0 when every mutation is caught, 1 when
some survive, 2 on a setup error (a mutation whose text is missing, a baseline that fails).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "tests/test_bite_engine.py"
METRICS = "tests/test_bite_metrics.py"
POLICIES = "tests/test_bite_policies.py"
PROPS = "tests/test_properties.py"
COMPILED = "tests/test_compiled_engine.py"
ITERATION = ("tests/test_golden.py", ENGINE, "tests/test_bite_iteration.py", COMPILED, "tests/test_engine.py")
"""What pins the iteration: the golden replays, hand-computed cases and the branch cases (interpreted)."""
_ANYWHERE = shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
                                   "*.egg-info", "*.so", "engine.c")
"""Left out of the scratch copy: caches and the compiled engine, so that the engine runs from its (mutated) source."""
_AT_ROOT = {"runs", "studies", "results", "out", "build", "dist"}
"""Output folders left out only at the top of the tree (``docs/results`` holds tracked results that tests read)."""


def ignored_in_scratch(folder: str, names: list[str]) -> set[str]:
    ignored = set(_ANYWHERE(folder, names))
    return ignored | (_AT_ROOT & set(names)) if Path(folder) == ROOT else ignored


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    old: str
    new: str
    targets: tuple[str, ...]
    """pytest arguments: test files, node ids, ``-k`` expressions."""
    kind: str


def m(id: str, file: str, old: str, new: str, *targets: str, kind: str) -> Mutation:
    return Mutation(id, file, old, new, targets, kind)


ADMIT_STOP = "            if self.num_running >= self.max_num_seqs or blocks > free:\n                break"
TWP_GATE = ("            if token_load_after + want[i] > self.window or kv_free - blocks[i] <= self.kv_guard:\n"
            "                break")
MC_LINE = "upper_remaining_queue(rows, bound))"
MC_SF_LINE = "count = longest_feasible_prefix(obs, upper_remaining_running(obs), rows, upper_remaining_queue(rows),"
TASKS = "tests/test_tasks.py"
ATTENTION = "tests/test_real_attention.py"
MEMORY = "tests/test_real_memory.py"
SUPPORT = "tests/test_real_support.py"
DEVICE = "tests/test_real_device.py"
CALIBRATE = "tests/test_calibrate_cli.py"
RAY = "tests/test_ray_executor.py"
JOBS = "tests/test_jobs.py"
POSTGRES = "tests/test_tune_postgres.py"
TUNING = "tests/test_tuning.py"
R48_SUBMISSION = "tests/test_bite_round48_submission.py"
R48_VERDICTS = "tests/test_bite_round48_verdicts.py"
BASELINES = "tests/test_baselines.py"
R48_STATS = "tests/test_bite_round48_stats.py"
R48_TRACE = "tests/test_bite_round48_trace.py"
R48_ACTIONS = "tests/test_bite_round48_actions.py"
R48_ORACLE = "tests/test_bite_round48_oracle.py"
R48_SCORER = "tests/test_bite_round48_scorer_gains.py"
R48_ENGINE = "tests/test_bite_round48_engine.py"

MUTATIONS: list[Mutation] = [
    # ------------------------------------------------------------------ engine admission
    m("admit-first-chunk-floor", "engine/engine.py",
      "blocks = _blocks(first + (1 if first == target else 0), self.block_size)",
      "blocks = (first + (1 if first == target else 0)) // self.block_size",
      ENGINE, "-k", "first_chunk or sampled_token or chunked_admission", kind="engine admission"),
    m("admit-whole-prompt", "engine/engine.py",
      "blocks = _blocks(first + (1 if first == target else 0), self.block_size)",
      "blocks = _blocks(target + 1, self.block_size)",
      ENGINE, "-k", "chunked_admission", kind="engine admission"),
    m("admit-skips-misfit", "engine/engine.py", ADMIT_STOP, ADMIT_STOP.replace("break", "continue"),
      ENGINE, "-k", "stops_at_the_first", kind="engine admission"),
    m("admit-seat-off-by-one", "engine/engine.py",
      "if self.num_running >= self.max_num_seqs or blocks > free:",
      "if self.num_running > self.max_num_seqs or blocks > free:",
      ENGINE, "-k", "max_num_seqs", kind="engine admission"),
    m("never-fits-ge", "engine/engine.py",
      "if self.prompt[rid] + self.output[rid] > capacity:", "if self.prompt[rid] + self.output[rid] >= capacity:",
      ENGINE, "-k", "never_fits", kind="engine admission"),
    m("never-fits-plus-one", "engine/engine.py",
      "if self.prompt[rid] + self.output[rid] > capacity:", "if self.prompt[rid] + self.output[rid] > capacity + 1:",
      ENGINE, "-k", "never_fits", kind="engine admission"),
    m("max-tokens-not-capped", "pool/cluster.py",
      "output = np.minimum(spec.num_output_tokens, cfg.max_tokens)", "output = spec.num_output_tokens",
      ENGINE, "-k", "never_fits", kind="engine admission"),
    # ------------------------------------------------------------------ preemption and bookkeeping
    m("admit-time-overwritten", "engine/engine.py",
      "            if self.admit_s[rid] != self.admit_s[rid]:  # NaN: first admission\n",
      "            if True:\n",
      ENGINE, "-k", "queue_head", kind="preemption"),
    m("first-token-overwritten", "engine/engine.py",
      "            if self.first_token_s[rid] != self.first_token_s[rid]:  # NaN: its first token ever\n",
      "            if True:\n",
      ENGINE, "-k", "queue_head or first_token_time_survives", kind="preemption"),
    m("preempted-to-queue-back", "engine/engine.py",
      "self.waiting = np.concatenate([ids, self.waiting])", "self.waiting = np.concatenate([self.waiting, ids])",
      ENGINE, "-k", "queue_head", kind="preemption"),
    m("preemption-forgets-generated", "engine/engine.py",
      "self.generated_at_preemption[rid] = run[row, GEN] if keep else 0",
      "self.generated_at_preemption[rid] = 0",
      PROPS, "-k", "random_actions or seeded", kind="preemption"),
    m("preemption-segment-off-by-one", "engine/engine.py",
      "log.seg_last.append(self.step_index - 1)", "log.seg_last.append(self.step_index)",
      PROPS, "-k", "random_actions or seeded", kind="preemption"),
    m("preempted-marked-pending", "engine/engine.py",
      "            self.state[rid] = PREEMPTED\n", "            self.state[rid] = 0  # PENDING\n",
      PROPS, "-k", "random_actions or seeded", kind="conservation"),
    m("finished-not-marked", "engine/engine.py",
      "            self.state[rid] = FINISHED\n", "            self.state[rid] = DECODING\n",
      PROPS, "-k", "random_actions or seeded", kind="conservation"),
    m("lifo-evicts-oldest", "engine/preemption.py",
      "return np.array([n - 1])", "return np.array([0])",
      ENGINE, POLICIES, "-k", "queue_head or evicts_the_newest", kind="preemption"),
    # ------------------------------------------------------------------ KV accounting (caught without check_invariants)
    m("kv-leak-on-release", "engine/engine.py",
      "self.num_used_blocks -= _blocks(run[i, KV], self.block_size)",
      "self.num_used_blocks -= run[i, KV] // self.block_size",
      PROPS, "-k", "random_actions or seeded", kind="conservation"),
    m("kv-need-floor", "engine/engine.py",
      "need += _blocks(kv + tokens + self.done[i], bs) - _blocks(kv, bs)",
      "need += (kv + tokens + self.done[i]) // bs - kv // bs",
      PROPS, "-k", "random_actions or seeded", kind="conservation"),
    m("kv-decode-phase", "engine/engine.py",
      "need = self.phases[_mod(-step, bs)]",
      "need = self.phases[_mod(step, bs)]",
      PROPS, "-k", "random_actions or seeded", kind="conservation"),
    m("phase-of-new-decoder", "engine/engine.py",
      "self.phases[_mod(kv - step - 1, bs)] += 1",
      "self.phases[_mod(kv - step, bs)] += 1",
      ENGINE, PROPS, "-k", "check_invariants or random_actions or seeded", kind="conservation"),
    m("finish-countdown-ignores-new-decoders", "engine/engine.py",
      "            self._finish_countdown = min(self._finish_countdown, run[row, OUT] - run[row, GEN])\n",
      "",
      ENGINE, PROPS, "-k", "check_invariants or random_actions or seeded", kind="conservation"),
    m("chunk-budget-off-by-one", "engine/engine.py",
      "            if wanted >= budget:\n                break",
      "            if wanted > budget:\n                break",
      ENGINE, "-k", "budget_is_spent", kind="conservation"),
    m("prefill-count-drift", "engine/engine.py",
      "            if run[row, PREFILL_LEFT] != 0:\n                self.num_prefilling -= 1\n",
      "            if run[row, PREFILL_LEFT] != 0:\n                self.num_prefilling -= 0\n",
      PROPS, "-k", "random_actions or seeded", kind="conservation"),
    m("token-load-drift", "engine/engine.py",
      "self.token_load -= decode_tokens", "self.token_load -= 0 * decode_tokens",
      PROPS, "-k", "random_actions or seeded", kind="conservation"),
    # ------------------------------------------------------------------ the invariant checker
    m("check-no-kv", "engine/engine.py",
      "if held != self.num_used_blocks or not 0 <= self.num_used_blocks <= self.num_kv_blocks:",
      "if not 0 <= self.num_used_blocks <= self.num_kv_blocks:",
      ENGINE, "-k", "check_invariants", kind="conservation"),
    m("check-no-duplicates", "engine/engine.py",
      "if np.unique(self.waiting).size != len(self.waiting):", "if False:",
      ENGINE, "-k", "check_invariants", kind="conservation"),
    m("check-no-queue-states", "engine/engine.py",
      "if not np.all((states == State.WAITING) | (states == State.PREEMPTED)):", "if False:",
      ENGINE, "-k", "check_invariants", kind="conservation"),
    m("check-no-running-states", "engine/engine.py",
      "if not np.all((run_states == State.PREFILLING) | (run_states == State.DECODING)):", "if False:",
      ENGINE, "-k", "check_invariants", kind="conservation"),
    m("check-no-token-load", "engine/engine.py",
      "if int((rows[:, HI] - rows[:, GEN]).sum()) != self.token_load:", "if False:",
      ENGINE, "-k", "check_invariants", kind="conservation"),
    m("check-no-prefill-count", "engine/engine.py",
      "if int(np.count_nonzero(rows[:, PREFILL_LEFT])) != self.num_prefilling:", "if False:",
      ENGINE, "-k", "check_invariants", kind="conservation"),
    m("check-flag-ignored", "engine/config.py",
      "    def __post_init__(self) -> None:\n        object.__setattr__(self, \"preemption\"",
      "    def __post_init__(self) -> None:\n        object.__setattr__(self, \"check_invariants\", False)\n"
      "        object.__setattr__(self, \"preemption\"",
      ENGINE, "-k", "check_invariants", kind="conservation"),
    m("check-cluster-counts-from-states", "pool/cluster.py",
      "queued = sum(e.waiting.size for e in self.engines)", "queued = c[\"num_waiting\"]",
      ENGINE, "-k", "check_invariants", kind="conservation"),
    # ------------------------------------------------------------------ metrics
    m("p99-is-p95", "metrics/core.py",
      "np.percentile(values, PERCENTILES)", "np.percentile(values, (50, 95, 95))",
      METRICS, kind="metrics"),
    m("percentile-nearest", "metrics/core.py",
      "np.percentile(values, PERCENTILES)", "np.percentile(values, PERCENTILES, method=\"nearest\")",
      METRICS, kind="metrics"),
    m("percentile-weibull", "metrics/core.py",
      "np.percentile(values, PERCENTILES)", "np.percentile(values, PERCENTILES, method=\"weibull\")",
      METRICS, kind="metrics"),
    m("e2e-from-admission", "metrics/core.py",
      "return log.finish_s[done] - log.arrival_s[done]", "return log.finish_s[done] - log.admit_s[done]",
      METRICS, kind="metrics"),
    m("ttft-from-admission", "metrics/core.py",
      "return log.first_token_s[have] - log.arrival_s[have]", "return log.first_token_s[have] - log.admit_s[have]",
      METRICS, kind="metrics"),
    m("tpot-divides-by-output", "metrics/core.py",
      "np.maximum(out - 1, 1)", "np.maximum(out, 1)",
      METRICS, kind="metrics"),
    m("goodput-ttft-from-admission", "metrics/core.py",
      "return (first - log.arrival_s[ids] <= ttft_slo_s)", "return (first - log.admit_s[ids] <= ttft_slo_s)",
      METRICS, kind="metrics"),
    m("kv-util-not-time-weighted", "metrics/core.py",
      "weights = dt if dt.sum() > 0 else np.ones_like(dt)", "weights = np.ones_like(dt)",
      METRICS, kind="metrics"),
    m("kv-util-std-not-time-weighted", "metrics/core.py",
      "std = float(np.sqrt(((used - mean) ** 2 * weights).sum() / weights.sum()))", "std = float(used.std())",
      METRICS, kind="metrics"),
    m("makespan-from-zero", "metrics/core.py",
      "return float(max(ends) - log.arrival_s[0])", "return float(max(ends))",
      METRICS, kind="metrics"),
    m("itl-cv-sample-std", "metrics/core.py",
      "return float(gaps.std() / gaps.mean())", "return float(gaps.std(ddof=1) / gaps.mean())",
      METRICS, kind="metrics"),
    m("throughput-counts-unfinished", "metrics/core.py",
      "tokens = int(log.num_output_tokens[log.state == State.FINISHED].sum())",
      "tokens = int(log.num_output_tokens.sum())",
      METRICS, kind="metrics"),
    m("queue-slope-is-intercept", "metrics/core.py",
      "total += float(np.polyfit(t, q, 1)[0])", "total += float(np.polyfit(t, q, 1)[1])",
      METRICS, kind="metrics"),
    m("token-times-drop-last", "engine/log.py",
      "out[r].append(ends[self.container[r]][first : last + 1])",
      "out[r].append(ends[self.container[r]][first : last])",
      METRICS, kind="metrics"),
    # ------------------------------------------------------------------ TWP
    m("twp-two-containers-read-as-one", "policies/twp.py", "pool.size <= len(POOL_FEATURES)",
      "pool.size <= 2 * len(POOL_FEATURES)", "tests/test_twp_containers.py", kind="twp"),
    m("twp-no-kv-guard-in-gate", "policies/twp.py", TWP_GATE,
      TWP_GATE.replace(" or kv_free - blocks[i] <= self.kv_guard", ""),
      POLICIES, "-k", "twp", kind="twp"),
    m("twp-gate-skips", "policies/twp.py", TWP_GATE, TWP_GATE.replace("break", "continue"),
      POLICIES, "-k", "twp", kind="twp"),
    m("twp-no-sigma-floor", "policies/twp.py", "/ max(0.5, sigma)", "/ sigma",
      POLICIES, "-k", "twp", kind="twp"),
    m("twp-no-itl-smoothing", "policies/twp.py",
      "self.itl_hat = itl if self.itl_hat is None else self.itl_hat + p.itl_filter * (itl - self.itl_hat)",
      "self.itl_hat = itl",
      POLICIES, "-k", "twp", kind="twp"),
    m("twp-window-jumps", "policies/twp.py",
      "self.window + p.gain * (target - self.window)", "target",
      POLICIES, "-k", "twp", kind="twp"),
    m("twp-queue-term-uncapped", "policies/twp.py",
      "min(1.0, queue_depth / p.queue_norm)", "queue_depth / p.queue_norm",
      POLICIES, "-k", "twp", kind="twp"),
    m("twp-guard-never-tightens-at-once", "policies/twp.py",
      "self.kv_guard = target if target > self.kv_guard else relaxed", "self.kv_guard = relaxed",
      POLICIES, "-k", "twp", kind="twp"),
    m("twp-guard-ignores-its-parameter", "policies/twp.py",
      "self.kv_guard = self.params.kv_guard", "self.kv_guard = 0.05",
      POLICIES, "-k", "twp", kind="twp"),
    m("twp-forces-at-t-max", "policies/twp.py",
      "queue[:, _Q[\"wait_steps\"]] > p.max_wait_steps)", "queue[:, _Q[\"wait_steps\"]] >= p.max_wait_steps)",
      POLICIES, "-k", "twp", kind="twp"),
    # ------------------------------------------------------------------ memory-aware baselines
    m("mc-queue-lower-bound", "policies/mc.py", MC_LINE,
      MC_LINE.replace("upper_remaining_queue(rows, bound)", "np.maximum(rows[:, 3] - rows[:, 5], 1.0)"),
      POLICIES, "-k", "upper_bound", kind="memory-aware"),
    m("mc-sf-queue-lower-bound", "policies/mc_sf.py", MC_SF_LINE,
      MC_SF_LINE.replace("upper_remaining_queue(rows)",
                      "np.maximum(rows[:, QUEUE_INDEX[\"output_lo\"]] - rows[:, QUEUE_INDEX[\"num_generated\"]], 1.0)"),
      POLICIES, "-k", "mc_sf or upper_bound", kind="memory-aware"),
    m("running-lower-bound", "policies/common.py",
      "hi = run[:, RUNNING_INDEX[\"output_hi\"]] if bound <= 0 else bound",
      "hi = run[:, RUNNING_INDEX[\"output_lo\"]] if bound <= 0 else bound",
      POLICIES, "-k", "upper_bound", kind="memory-aware"),
    m("queue-lower-bound", "policies/common.py",
      "hi = rows[:, QUEUE_INDEX[\"output_hi\"]] if bound <= 0 else bound",
      "hi = rows[:, QUEUE_INDEX[\"output_lo\"]] if bound <= 0 else bound",
      POLICIES, "-k", "upper_bound or mc_sf", kind="memory-aware"),
    m("r52-mc-ignores-its-unknown-bound", "policies/mc.py",
      "bound = self.params.unknown_output_bound if length_mode_of(obs) == LengthMode.UNKNOWN else 0.0",
      "bound = 0.0", BASELINES, "-k", "bound", kind="memory-aware"),
    m("r52-mc-bound-with-known-lengths", "policies/mc.py",
      "bound = self.params.unknown_output_bound if length_mode_of(obs) == LengthMode.UNKNOWN else 0.0",
      "bound = self.params.unknown_output_bound", BASELINES, "-k", "bound", kind="memory-aware"),
    m("r52-mc-sf-keeps-the-window", "policies/mc_sf.py",
      'return {"queue_window": self.params.window or WHOLE_QUEUE}', "return {}", BASELINES, "-k", "whole_queue",
      kind="memory-aware"),
    m("r52-runner-drops-env-overrides", "servegym/runner.py",
      "        env_kwargs = {**policy.env_overrides(), **env_kwargs}\n", "", BASELINES, "-k", "whole_queue",
      kind="memory-aware"),
    m("no-block-slack", "policies/kernels.py",
      "if peak + slack * (num_run + k + 1) > capacity:", "if peak > capacity:", POLICIES, "-k", "slack",
      kind="memory-aware"),
    m("peak-drops-a-candidate-finishing-then", "policies/kernels.py",
      "            if left[k] >= at:", "            if left[k] > at:", POLICIES, "-k", "feasible_prefix",
      kind="memory-aware"),
    m("peak-ignores-the-running-batch", "policies/kernels.py",
      "        acc[t] = total\n", "        acc[t] = 0.0\n", POLICIES, "-k", "feasible_prefix", kind="memory-aware"),
    m("mc-sf-sorts-by-lower-bound", "policies/mc_sf.py",
      "key = {\"output\": predicted,", "key = {\"output\": rows[:, QUEUE_INDEX[\"output_lo\"]],",
      POLICIES, "-k", "mc_sf", kind="memory-aware"),
    m("mc-sf-longest-first", "policies/mc_sf.py",
      "order = np.argsort(key, kind=\"stable\")", "order = np.argsort(-key, kind=\"stable\")",
      POLICIES, "-k", "mc_sf", kind="memory-aware"),
    m("mc-sf-ignores-memory-target", "policies/mc_sf.py", MC_SF_LINE + "\n" + " " * 40 + "self.params.memory_target)",
      MC_SF_LINE + "\n" + " " * 40 + "1.0)",
      "tests/test_rank_mode.py", kind="memory-aware"),
    # ------------------------------------------------------------------ rewards, guard, censoring (tasks)
    m("censored-latency-drops-unfinished", "metrics/core.py",
      "finish = np.where(log.state == State.FINISHED, log.finish_s, end)",
      "finish = np.where(log.state == State.FINISHED, log.finish_s, log.arrival_s)",
      TASKS, "-k", "censored or truncation or starving", kind="metrics"),
    m("truncation-penalty-only-on-guard", "envs/serving.py",
      "if (truncated or guarded) and self.reward_name == \"latency\":",
      "if guarded and self.reward_name == \"latency\":",
      TASKS, "-k", "truncation_penalty or starving", kind="env"),
    m("slo-reward-ignores-itl", "metrics/core.py",
      "return (first - log.arrival_s[ids] <= ttft_slo_s) & (tpot <= itl_slo_s)",
      "return first - log.arrival_s[ids] <= ttft_slo_s",
      TASKS, "-k", "slo_goodput", kind="metrics"),
    m("discount-from-step-end", "envs/serving.py",
      "reward *= self._discount(started_s)", "reward *= self._discount(self.cluster.time)",
      TASKS, "-k", "discount", kind="env"),
    m("decision-steps-skip-with-free-kv", "engine/engine.py",
      "and self.num_used_blocks < self.num_kv_blocks", "and self.num_used_blocks <= self.num_kv_blocks",
      TASKS, "-k", "decision_steps", kind="env"),
    m("guard-off-by-one", "envs/serving.py",
      "guarded = not terminated and self.idle_guard_steps is not None and self._num_stalled >= self.idle_guard_steps",
      "guarded = not terminated and self.idle_guard_steps is not None and self._num_stalled > self.idle_guard_steps",
      TASKS, "-k", "idle_guard", kind="env"),
    m("predicted-estimate-is-lower-bound", "policies/base.py",
      "return (lo + hi) / 2.0", "return lo.astype(np.float64)",
      POLICIES, "-k", "mc_sf", kind="memory-aware"),
    m("unknown-prior-not-raised-to-lo", "policies/base.py",
      "np.minimum(np.maximum(np.float64(unknown_prior), lo), hi)", "np.minimum(np.float64(unknown_prior), hi)",
      POLICIES, "tests/test_golden.py", kind="memory-aware"),
    m("unknown-prior-not-capped-at-hi", "policies/base.py",
      "np.minimum(np.maximum(np.float64(unknown_prior), lo), hi)", "np.maximum(np.float64(unknown_prior), lo)",
      POLICIES, "tests/test_golden.py", kind="memory-aware"),
    m("clairvoyant-longest-first", "policies/clairvoyant_greedy.py",
      "order = np.argsort(left + 1e-6", "order = np.argsort(-left + 1e-6",
      POLICIES, "-k", "clairvoyant", kind="memory-aware"),
    m("clairvoyant-without-true-lengths", "policies/clairvoyant_greedy.py",
      "return {\"length_mode\": \"known\", \"preemption\": \"lifo\"}", "return {\"preemption\": \"lifo\"}",
      POLICIES, "-k", "clairvoyant", kind="memory-aware"),
    # ------------------------------------------------------------------ flow control
    m("flow-control-fewest-generated", "policies/flow_control.py",
      "return {\"preemption\": \"lifo\"}", "return {\"preemption\": \"fewest_generated\"}",
      POLICIES, "-k", "flow_control", kind="flow control"),
    m("flow-control-no-override", "policies/flow_control.py",
      "return {\"preemption\": \"lifo\"}", "return {}",
      POLICIES, "-k", "flow_control", kind="flow control"),
    m("flow-control-drops-fraction", "policies/flow_control.py",
      "self.credit = max(self.credit - whole, 0.0)", "self.credit = 0.0",
      POLICIES, "-k", "flow_control", kind="flow control"),
    m("flow-control-no-rounding", "policies/flow_control.py",
      "_ROUNDING = 1e-9", "_ROUNDING = 0.0",
      POLICIES, "-k", "flow_control", kind="flow control"),
    m("flow-control-caps-at-floor-b", "policies/flow_control.py",
      "whole = math.floor(self.credit + _ROUNDING)",
      "whole = min(math.floor(self.credit + _ROUNDING), max(1, math.floor(self.rate)))",
      POLICIES, "-k", "flow_control", kind="flow control"),
    m("flow-control-classes-share-one-bucket", "policies/flow_control.py",
      "if self.class_buckets and length_mode_of(obs) is LengthMode.KNOWN:", "if False:",
      "tests/test_flow_control.py", "-k", "class", kind="flow control"),
    m("flow-control-class-skips-others", "policies/flow_control.py",
      "elif length not in grants and shared > 0:", "elif shared > 0:",
      "tests/test_flow_control.py", "-k", "per_class", kind="flow control"),
    m("class-budgets-ignore-shares", "servegym/stability.py",
      "return [(int(o), share / total * scale)", "return [(int(o), scale / len(shares)",
      "tests/test_flow_control.py", "-k", "sufficient", kind="flow control"),
    m("amin-evicts-fewest-generated", "engine/preemption.py",
      "        key = amin_estimate(output_lo.astype(np.float64), output_hi.astype(np.float64), generated)",
      "        key = generated", "tests/test_engine.py", "-k", "shortest_predicted", kind="memory-aware"),
    m("twp-no-parallelism-floor", "policies/twp.py",
      "return min(p.window_max, max(p.window_min, b0 * mean))", "return p.window_min",
      "tests/test_twp.py", "-k", "floor", kind="twp"),
    m("twp-floor-from-queue-always", "policies/twp.py",
      "floor = self._window_floor(mean_remaining if batch else None, want)",
      "floor = self._window_floor(None, want)",
      "tests/test_twp.py", POLICIES, "-k", "floor", kind="twp"),
    m("twp-total-chunk-cap-always", "policies/twp.py",
      "\"max_prefill_tokens\": c if self.params.chunking == \"total\" else None", "\"max_prefill_tokens\": c",
      "tests/test_twp.py", "-k", "chunking", kind="twp"),
    m("kv-std-unweighted", "metrics/core.py",
      "weights = dt if dt.sum() > 0 else np.ones_like(dt)", "weights = np.ones_like(dt)",
      "tests/test_metrics.py", METRICS, kind="metrics"),
    # ------------------------------------------------------------------ backend, workloads, determinism
    m("backend-drops-decode-context", "backends/profile.py",
      "context = t.decode_context if self.decode_s_per_context_token else 0.0", "context = 0.0",
      ENGINE, "-k", "decode_context", kind="backend"),
    m("token-model-drops-decode-context", "backends/token_model.py",
      "return self.total_s(decodes, decodes, t.decode_context, 0.0, decodes)",
      "return self.total_s(decodes, decodes, 0.0, 0.0, decodes)",
      ENGINE, "-k", "decode_context", kind="backend"),
    m("decode-context-after-the-step", "engine/engine.py",
      "                context += run[i, KV]\n",
      "                context += run[i, KV] + 1\n",
      ENGINE, "-k", "decode_context", kind="backend"),
    m("prefill-attention-off-by-one", "backends/base.py",
      "return float(np.dot(length, start + (length + 1) * 0.5))",
      "return float(np.dot(length, start + length * 0.5))",
      ENGINE, "-k", "prefill_attention", kind="backend"),
    m("backend-noise-unseeded", "backends/calibrated.py",
      "self._rng.standard_normal()", "np.random.standard_normal()",
      ENGINE, "-k", "same_seed", kind="determinism"),
    m("mmpp-starts-in-burst", "workloads/arrivals.py",
      "parts, t, burst = [], 0.0, False", "parts, t, burst = [], 0.0, True",
      ENGINE, "-k", "mmpp", kind="workload"),
    m("predicted-lengths-unseeded", "pool/cluster.py",
      "u = rng.random((2, output.size))", "u = np.random.default_rng().random((2, output.size))",
      ENGINE, "-k", "same_seed", kind="determinism"),
    m("predicted-hi-below-truth", "pool/cluster.py",
      "np.ceil(output * (1.0 + err * u[1]))", "np.ceil(output * (1.0 - err * u[1]))",
      PROPS, "-k", "random_actions or seeded", kind="determinism"),
    m("workload-lengths-unseeded", "workloads/synthetic.py",
      "prompt, output = self.prompt.sample(rng, n), self.output.sample(rng, n)",
      "prompt, output = self.prompt.sample(np.random.default_rng(), n), self.output.sample(rng, n)",
      ENGINE, "-k", "same_seed", kind="determinism"),
    # ------------------------------------------------------------------ real backend: attention plans
    m("attn-cu-k-from-query-lens", "backends/attention.py",
      "\"cu_k\": np.concatenate([[0], np.cumsum(context_lens)])",
      "\"cu_k\": np.concatenate([[0], np.cumsum(query_lens)])",
      ATTENTION, "-k", "varlen_plan_is_ragged", kind="real backend"),
    m("attn-context-slots-floor", "backends/attention.py",
      "np.asarray(row.blocks[: -(-row.context_len // block_size)], dtype=np.int64)",
      "np.asarray(row.blocks[: row.context_len // block_size], dtype=np.int64)",
      ATTENTION, "-k", "varlen_plan_is_ragged", kind="real backend"),
    m("attn-tile-context-short", "backends/attention.py",
      "out.append(Row(r.query_start + start, count, first + start + count, r.blocks))",
      "out.append(Row(r.query_start + start, count, first + start + count - 1, r.blocks))",
      ATTENTION, "-k", "query_tiles", kind="real backend"),
    m("attn-tile-cost-no-gather", "backends/attention.py",
      "sum(-(-r.query_len // t) for r in rows) * (t + GATHER_WEIGHT)", "sum(-(-r.query_len // t) for r in rows) * t",
      ATTENTION, "-k", "query_tiles or pads_rows", kind="real backend"),
    m("attn-mask-strict", "backends/attention.py",
      "mask = torch.arange(call.context, device=device) <= position",
      "mask = torch.arange(call.context, device=device) < position",
      ATTENTION, "-k", "pads_rows", kind="real backend"),
    m("attn-group-limit-inclusive", "backends/attention.py",
      "if r.context_len > limit), len(part))", "if r.context_len >= limit), len(part))",
      ATTENTION, "-k", "grouped", kind="real backend"),
    m("attn-group-slack-no-block", "backends/attention.py",
      "limit = PADDING_SLACK * part[0].context_len + block_size", "limit = PADDING_SLACK * part[0].context_len",
      ATTENTION, "-k", "grouped", kind="real backend"),
    m("attn-output-offset-per-row", "backends/attention.py",
      "offset += b * q", "offset += b",
      ATTENTION, "-k", "grouped", kind="real backend"),
    # ------------------------------------------------------------------ real backend: KV sizing, refusals, clock
    m("kv-bytes-keys-only", "backends/kv_memory.py",
      "return 2 * layers * kv_heads", "return layers * kv_heads",
      MEMORY, "-k", "bytes_per_block", kind="real backend"),
    m("kv-fit-ceil", "backends/kv_memory.py",
      "return max(budget, 0) // block_bytes", "return -(-max(budget, 0) // block_bytes)",
      MEMORY, "-k", "blocks_fill", kind="real backend"),
    m("kv-fits-equality-refused", "backends/kv_memory.py",
      "if needed > available_bytes:", "if needed >= available_bytes:",
      MEMORY, "-k", "does_not_fit", kind="real backend"),
    m("kv-utilization-one-refused", "backends/kv_memory.py",
      "if not 0 < utilization <= 1:", "if not 0 < utilization < 1:",
      MEMORY, "-k", "blocks_fill", kind="real backend"),
    m("support-no-softcap", "backends/support.py",
      "if softcap is not None:", "if False:",
      SUPPORT, "-k", "soft-capping", kind="real backend"),
    m("support-no-chunked-layers", "backends/support.py",
      "(\"chunked local attention\", \"chunked\")", "(\"chunked local attention\", \"sliding\")",
      SUPPORT, "-k", "config", kind="real backend"),
    m("support-window-ignores-use-flag", "backends/support.py",
      "if window is not None and getattr(config, \"use_sliding_window\", True) and not layer_types:",
      "if window is not None and not layer_types:",
      SUPPORT, "-k", "config or qwen2", kind="real backend"),
    m("support-no-mpt-alibi", "backends/support.py",
      "return bool(getattr(attn_config, \"alibi\", False))", "return False",
      SUPPORT, "-k", "alibi", kind="real backend"),
    m("dtype-bf16-above-8-0", "backends/torch_backend.py",
      "capability >= (8, 0)", "capability > (8, 0)",
      DEVICE, "-k", "default_dtype", kind="real backend"),
    m("device-index-off-by-one", "backends/torch_backend.py",
      "resolved.index >= torch.cuda.device_count()", "resolved.index > torch.cuda.device_count()",
      DEVICE, "-k", "device_resolution", kind="real backend"),
    m("host-time-never-counted", "backends/torch_backend.py",
      "return total if self.count_host_time else forward", "return forward",
      DEVICE, "-k", "host_time", kind="real backend"),
    m("host-time-drops-packing", "backends/torch_backend.py",
      "total = clock() - start", "total = clock() - prepared",
      DEVICE, "-k", "host_time", kind="real backend"),
    # ------------------------------------------------------------------ calibration sweep and provenance
    m("sweep-kv-no-generated-token", "backends/calibration_sweep.py",
      "_blocks(int(c) + 1 + growth, block_size) for c in self.rows(context, rows)",
      "_blocks(int(c) + growth, block_size) for c in self.rows(context, rows)",
      CALIBRATE, "-k", "kv_blocks_needed", kind="calibration"),
    m("sweep-blocks-floor", "backends/calibration_sweep.py",
      "    return -(-tokens // block_size)", "    return tokens // block_size",
      CALIBRATE, "-k", "kv_blocks_needed", kind="calibration"),
    m("sweep-fits-equality-refused", "backends/calibration_sweep.py",
      "if need > num_kv_blocks:", "if need >= num_kv_blocks:",
      CALIBRATE, "-k", "overflows", kind="calibration"),
    m("sweep-mixed-context-uncapped", "backends/calibration_sweep.py",
      "mixed_context=min(128, max_context)", "mixed_context=128",
      CALIBRATE, "-k", "limits", kind="calibration"),
    m("spread-warning-at-threshold", "backends/calibration_provenance.py",
      "if median <= threshold:", "if median < threshold:",
      CALIBRATE, "-k", "spread", kind="calibration"),
    m("spread-summary-lists-at-threshold", "backends/calibration_provenance.py",
      "if p.relative_spread > threshold}}", "if p.relative_spread >= threshold}}",
      CALIBRATE, "-k", "spread", kind="calibration"),
    m("spread-of-one-repeat", "backends/calibration_provenance.py",
      "if len(seconds) > 1 and median > 0", "if median > 0",
      CALIBRATE, "-k", "single_repeat", kind="calibration"),
    # ------------------------------------------------------------------ executors, run store, storages
    m("executor-address-without-ray", "evaluation/executor.py",
      "if self.address is not None and self.kind != \"ray\":", "if False:",
      RAY, "-k", "executor_choices", kind="executor"),
    m("stored-under-wrong-key", "evaluation/executor.py",
      "store.put(missing[index], result)", "store.put(jobs[index], result)",
      JOBS, "-k", "stored", kind="executor"),
    m("stored-failure-indices-unmapped", "evaluation/executor.py",
      "stop.results = {**have, **{missing_index[i]: r for i, r in stop.results.items()}}",
      "stop.results = {**have, **stop.results}",
      JOBS, "-k", "stored", kind="executor"),
    m("ray-cancel-skipped", "evaluation/ray_executor.py",
      "ray.cancel(ref, force=True)", "pass",
      RAY, "-k", "cancels", kind="executor"),
    m("ray-cancels-on-its-own-instance", "evaluation/ray_executor.py",
      "for ref in running if cancel_on_stop else ():", "for ref in running:",
      RAY, "-k", "did_not_start", kind="executor"),
    m("ray-limit-ignored", "evaluation/ray_executor.py",
      "while pending and len(running) < limit:", "while pending:",
      RAY, "-k", "failing_job or at_most", kind="executor"),
    m("storage-password-shown", "tuning/storage.py",
      "render_as_string(hide_password=True)", "render_as_string(hide_password=False)",
      POSTGRES, "-k", "driver", kind="tuning"),
    m("storage-prefers-psycopg3", "tuning/storage.py",
      "for driver in (\"psycopg2\", \"psycopg\"):", "for driver in (\"psycopg\", \"psycopg2\"):",
      POSTGRES, "-k", "driver", kind="tuning"),
    m("storage-open-error-unmasked", "tuning/storage.py",
      "raise TuningError(f\"cannot open Optuna storage {public_url(url)!r}",
      "raise TuningError(f\"cannot open Optuna storage {url!r}",
      TUNING, "-k", "bad_storage or password", kind="tuning"),
    # ------------------------------------------------------------------ flat observations
    m("flat-queue-before-pool", "envs/observation.py",
      "\"engine\": len(ENGINE_FEATURES), \"pool\": num_containers * len(POOL_FEATURES),\n"
      "                 \"prefix\": len(PREFIX_SCHEMA) if prefix else 0, \"progress\": len(PROGRESS_FEATURES),",
      "\"engine\": len(ENGINE_FEATURES), \"progress\": len(PROGRESS_FEATURES),\n"
      "                 \"prefix\": len(PREFIX_SCHEMA) if prefix else 0, "
      "\"pool\": num_containers * len(POOL_FEATURES),",
      "tests/test_flat_obs.py", "-k", "gymnasiums_flatten", kind="env"),
    m("flat-buffer-reused", "envs/observation.py",
      "buf = np.zeros(self.size, dtype=np.float32)",
      "buf = self.__dict__.setdefault(\"_buf\", np.zeros(self.size, dtype=np.float32))",
      COMPILED, kind="env"),
    m("fcfs-count-fits-below-budget", "policies/kernels.py",
      "        if count == slots or used > budget_blocks:", "        if count == slots or used >= budget_blocks:",
      POLICIES, "-k", "fcfs_count", kind="policy"),
    m("vllm-counts-prefills-as-decodes", "policies/vllm.py",
      "budget - (num_running - prefilling.size) - chunks", "budget - prefilling.size - chunks",
      "tests/test_pins_policies.py", "-k", "vllm", kind="policy"),
    m("vllm-ongoing-chunk-uncapped", "policies/vllm.py",
      "np.minimum(prefilling, engine[_CHUNK])", "np.maximum(prefilling, engine[_CHUNK])",
      "tests/test_pins_policies.py", "-k", "vllm", kind="policy"),
    m("vllm-budget-goes-negative", "policies/vllm.py",
      "return max(0, budget - (num_running", "return (budget - (num_running",
      "tests/test_pins_policies.py", "-k", "vllm", kind="policy"),
    m("vllm-first-chunk-without-its-token", "policies/vllm.py",
      "need = num_blocks(first + (first == target), block)", "need = num_blocks(first, block)",
      "tests/test_pins_policies.py", "-k", "vllm", kind="policy"),
    m("vllm-refuses-an-exact-fit", "policies/vllm.py",
      "if budget_left <= 0 or need > blocks:", "if budget_left <= 0 or need >= blocks:",
      "tests/test_pins_policies.py", "-k", "vllm", kind="policy"),
    m("vllm-admits-on-a-spent-budget", "policies/vllm.py",
      "if budget_left <= 0 or need > blocks:", "if budget_left < 0 or need > blocks:",
      "tests/test_pins_policies.py", "-k", "vllm", kind="policy"),
    m("vllm-admits-after-one-preemption", "policies/vllm.py",
      "if engine[_PREEMPTIONS] > 0:", "if engine[_PREEMPTIONS] > 1:",
      "tests/test_baselines.py", "-k", "vllm", kind="policy"),
    m("alpha-protection-ceiling-ignores-usage", "policies/alpha_protection.py",
      "ceiling = (1.0 - self.params.alpha) * total - used", "ceiling = (1.0 - self.params.alpha) * total",
      "tests/test_baselines.py", "-k", "alpha_protection", kind="policy"),
    m("alpha-protection-alpha-as-the-usable-share", "policies/alpha_protection.py",
      "ceiling = (1.0 - self.params.alpha) * total - used", "ceiling = self.params.alpha * total - used",
      "tests/test_baselines.py", "-k", "alpha_protection", kind="policy"),
    m("alpha-protection-evicts-one-on-overflow", "policies/alpha_protection.py",
      'return {"preemption": "clear_all"}', 'return {"preemption": "lifo"}',
      "tests/test_baselines.py", "-k", "alpha_protection", kind="policy"),
    m("amin-admits-longest-estimate-first", "policies/amin.py",
      'order = np.argsort(estimate - queued_gen, kind="stable")',
      'order = np.argsort(queued_gen - estimate, kind="stable")',
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "amin", kind="policy"),
    m("amin-estimates-from-the-upper-end", "policies/amin.py",
      'estimate = amin_estimate(rows[:, QUEUE_INDEX["output_lo"]]',
      'estimate = amin_estimate(rows[:, QUEUE_INDEX["output_hi"]]',
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "amin", kind="policy"),
    m("amin-running-planned-at-whole-estimate", "policies/amin.py",
      "np.maximum(self.running_estimates - generated, 1.0)", "np.maximum(self.running_estimates, 1.0)",
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "amin", kind="policy"),
    m("dynamic-batch-cap-ignores-the-running-batch", "policies/dynamic_batch.py",
      'room = max(0, self.params.max_batch - int(engine_feature(obs, "num_running")))',
      "room = self.params.max_batch",
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "dynamic_batch", kind="policy"),
    m("dynamic-batch-cap-max-for-min", "policies/dynamic_batch.py",
      "min(room, fcfs_count(obs))", "max(room, fcfs_count(obs))",
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "dynamic_batch", kind="policy"),
    m("dynamic-batch-holds-at-the-target", "policies/dynamic_batch.py",
      'if engine_feature(obs, "itl_smoothed_s") > self.params.itl_target_s:',
      'if engine_feature(obs, "itl_smoothed_s") >= self.params.itl_target_s:',
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "dynamic_batch", kind="policy"),
    m("priority-longest-prompt-first", "policies/priority.py",
      'order = np.argsort(visible_queue(obs)[:, QUEUE_INDEX["num_prompt_tokens"]], kind="stable")',
      'order = np.argsort(-visible_queue(obs)[:, QUEUE_INDEX["num_prompt_tokens"]], kind="stable")',
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "priority", kind="policy"),
    m("priority-sorts-by-output-bound", "policies/priority.py",
      'QUEUE_INDEX["num_prompt_tokens"]', 'QUEUE_INDEX["output_hi"]',
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "priority", kind="policy"),
    m("priority-counts-fits-in-queue-order", "policies/priority.py",
      "order[: fcfs_count(obs, order)]", "order[: fcfs_count(obs)]",
      "tests/test_baselines.py", "tests/test_pins_policies.py", "-k", "priority", kind="policy"),
    m("round-robin-policy-routes-least-loaded", "policies/round_robin.py",
      'return {"router": "round_robin"}', 'return {"router": "least_loaded"}',
      "tests/test_baselines.py", "-k", "round_robin", kind="policy"),
    m("serverless-llm-routes-least-loaded", "policies/serverless_llm.py",
      '"router": "warm_first"', '"router": "least_loaded"',
      "tests/test_baselines.py", "-k", "serverless", kind="policy"),
    m("serverless-llm-cold-start-unscaled", "policies/serverless_llm.py",
      '"cold_start_scale": 1.0 / self.params.load_speedup', '"cold_start_scale": 1.0',
      "tests/test_baselines.py", "-k", "serverless", kind="policy"),
    m("random-admits-with-one-minus-p", "policies/random_admit.py",
      "self.rng.random(visible) < self.params.admit_probability",
      "self.rng.random(visible) > self.params.admit_probability",
      "tests/test_pins_policies.py", "-k", "random", kind="policy"),
    m("random-coins-for-empty-slots", "policies/random_admit.py",
      "visible = visible_queue(obs).shape[0]", "visible = width",
      "tests/test_pins_policies.py", "-k", "random", kind="policy"),
    m("random-seed-not-restarted", "policies/random_admit.py",
      "self.rng = np.random.default_rng(self.params.seed)", "self.rng = np.random.default_rng()",
      "tests/test_policies.py", "-k", "deterministic and random", kind="policy"),
    # pool routing: benchmarks/mutants/routing.py
    # ------------------------------------------------------------------ the iteration (engine/engine.py, interpreted)
    m("core-chunk-starts-at-budget", "engine/engine.py",
      "            if wanted >= budget:", "            if wanted > budget:", *ITERATION, kind="engine"),
    m("core-pairs-off-by-one", "engine/engine.py",
      "pairs += self.chunk[i] * (start + (self.chunk[i] + 1) * 0.5)",
      "pairs += self.chunk[i] * (start + self.chunk[i] * 0.5)", *ITERATION, kind="engine"),
    m("core-admit-forgets-first-token", "engine/engine.py",
      "blocks = _blocks(first + (1 if first == target else 0), self.block_size)",
      "blocks = _blocks(first, self.block_size)", *ITERATION, kind="engine"),
    m("core-removal-keeps-token-load", "engine/engine.py",
      "                self.token_load -= run[i, HI] - run[i, GEN]\n", "", *ITERATION, kind="engine"),
    m("core-itl-not-smoothed", "engine/engine.py",
      "self.itl_smoothed += self.smoothing * (dt - self.itl_smoothed)", "self.itl_smoothed = dt", *ITERATION,
      kind="engine"),
    m("core-arrival-not-enqueued", "engine/engine.py",
      "                self.enqueue_step[rid] = self.step_index\n", "", *ITERATION, kind="engine"),
    m("core-totals-bypass-overridden-execute", "engine/engine.py",
      "self._totals = backend.execute_totals if owner is not None and \"execute_totals\" in vars(owner) else None",
      "self._totals = getattr(backend, \"execute_totals\", None)", *ITERATION, kind="engine"),
    m("core-batch-context-after-the-step", "engine/engine.py",
      "return StepBatch(run[:n, REQ], run[:n, KV], EMPTY, EMPTY, EMPTY, EMPTY)",
      "return StepBatch(run[:n, REQ], run[:n, KV] + 1, EMPTY, EMPTY, EMPTY, EMPTY)", *ITERATION, kind="engine"),
    m("core-obs-admitted-for-finished", "engine/engine.py",
      "self.last.num_admitted, self.last.num_finished, length_mode",
      "self.last.num_admitted, self.last.num_admitted, length_mode", *ITERATION,
      kind="engine"),
    m("core-queue-wait-from-enqueue", "engine/engine.py",
      "buf[at + 1] = self.clock - self.arrival_s[rid]", "buf[at + 1] = self.clock - self.admit_s[rid]", *ITERATION,
      kind="engine"),
    # ------------------------------------------------------------------ issue 48 item 9: unpinned by a fresh audit
    # bench --verify's refusals (tests/test_bite_round48_submission.py)
    m("r48-verify-row-count-unchecked", "benchmark/submission.py",
      '    if len(data["rows"]) != len(replayed):', "    if False:", R48_SUBMISSION, kind="bench"),
    m("r48-verify-nan-matches-anything", "benchmark/submission.py",
      "and math.isnan(a) and math.isnan(b)", "and (math.isnan(a) or math.isnan(b))", R48_SUBMISSION, kind="bench"),
    m("r48-verify-model-digest-unchecked", "benchmark/submission.py",
      "        if files.get(name) != claimed.get(name):", "        if False:", R48_SUBMISSION, kind="bench"),
    m("r48-verify-any-format-version", "benchmark/submission.py",
      '    if missing or data.get("format") != FORMAT:', "    if missing:", R48_SUBMISSION, kind="bench"),
    m("r48-verify-task-settings-unchecked", "benchmark/submission.py",
      "        problems.append(f\"task {data['task']}: its settings differ from this servegym's\")", "        pass",
      R48_SUBMISSION, kind="bench"),
    m("r48-verify-first-columns-only", "benchmark/submission.py",
      "        for name in names:", "        for name in names[:4]:", R48_SUBMISSION, kind="bench"),
    # the reproduction verdict rules at their edges (tests/test_bite_round48_verdicts.py)
    m("r48-verdicts-half-failing-is-not", "evaluation/verdicts.py",
      "    elif verdicts.count(NOT) > len(verdicts) / 2:", "    elif verdicts.count(NOT) >= len(verdicts) / 2:",
      R48_VERDICTS, kind="verdict"),
    m("r48-verdicts-one-partly-is-enough", "evaluation/verdicts.py",
      "    if all(v == REPRODUCED for v in verdicts):", "    if any(v == REPRODUCED for v in verdicts):",
      R48_VERDICTS, kind="verdict"),
    m("r52-every-pair-one-win-is-partly", "evaluation/verdicts.py",
      "    if 2 * wins > total and not losses:", "    if wins and not losses:", R48_VERDICTS, kind="verdict"),
    m("r52-every-pair-losses-ignored", "evaluation/verdicts.py",
      "    if 2 * wins > total and not losses:", "    if 2 * wins > total:", R48_VERDICTS, kind="verdict"),
    m("r52-every-pair-half-is-most", "evaluation/verdicts.py",
      "    if 2 * wins > total and not losses:", "    if 2 * wins >= total and not losses:", R48_VERDICTS,
      kind="verdict"),
    m("r52-every-pair-loss-not-counted", "evaluation/verdicts.py",
      "            won, lost = ci.low > 0, ci.high < 0", "            won, lost = ci.low > 0, False", R48_VERDICTS,
      kind="verdict"),
    m("r48-verdicts-beats-direction-ignored", "evaluation/verdicts.py",
      "    sign = -1.0 if higher_is_better else 1.0", "    sign = 1.0", R48_VERDICTS, kind="verdict"),
    m("r48-verdicts-lowest-tie-is-not", "evaluation/verdicts.py",
      "        if any(ci.high < 0 for ci in diffs.values()):", "        if any(ci.high <= 0 for ci in diffs.values()):",
      R48_VERDICTS, kind="verdict"),
    m("r48-verdicts-lowest-tie-is-reproduced", "evaluation/verdicts.py",
      "        elif all(ci.low > 0 for ci in diffs.values()):",
      "        elif all(ci.low >= 0 for ci in diffs.values()):",
      R48_VERDICTS, kind="verdict"),
    m("r48-verdicts-lowest-shows-the-farthest", "evaluation/verdicts.py",
      "        closest = min(diffs, key=lambda p: diffs[p].low)",
      "        closest = max(diffs, key=lambda p: diffs[p].low)",
      R48_VERDICTS, kind="verdict"),
    m("r48-verdicts-touching-edge-is-not", "evaluation/verdicts.py",
      "    if ci.high < low or ci.low > high:", "    if ci.high <= low or ci.low >= high:",
      R48_VERDICTS, kind="verdict"),
    m("r48-verdicts-gain-from-zero-is-partly", "evaluation/verdicts.py",
      "    return PARTLY if verdict == NOT and ci.low > 0 else verdict",
      "    return PARTLY if verdict == NOT and ci.low >= 0 else verdict", R48_VERDICTS, kind="verdict"),
    # evaluation/stats.py (tests/test_bite_round48_stats.py)
    m("r48-stats-t-linear-in-df", "evaluation/stats.py",
      "    frac = (1 / df - 1 / lower) / (1 / upper - 1 / lower)", "    frac = (df - lower) / (upper - lower)",
      R48_STATS, kind="stats"),
    m("r48-stats-t-from-the-upper-end", "evaluation/stats.py",
      "    return _T975[lower] + frac * (_T975[upper] - _T975[lower])",
      "    return _T975[upper] + frac * (_T975[upper] - _T975[lower])", R48_STATS, kind="stats"),
    m("r48-stats-t-past-the-table", "evaluation/stats.py",
      "    if df > 120:\n        return 1.960", "    if df > 120:\n        return 1.980", R48_STATS, kind="stats"),
    m("r48-stats-population-sd", "evaluation/stats.py",
      "values.std(ddof=1)", "values.std(ddof=0)", R48_STATS, kind="stats"),
    m("r48-stats-unpaired-halves-added", "evaluation/stats.py",
      "    return Interval(ma - mb, math.hypot(ha, hb), paired=False)",
      "    return Interval(ma - mb, ha + hb, paired=False)", R48_STATS, kind="stats"),
    m("r48-stats-unpaired-ratio-signed-half", "evaluation/stats.py",
      "abs(ratio) * math.hypot(ha / ma, hb / mb)", "ratio * math.hypot(ha / ma, hb / mb)", R48_STATS, kind="stats"),
    m("r48-stats-paired-ratio-of-means", "evaluation/stats.py",
      "        return Interval(*mean_ci(np.array([a[s] / b[s] - 1.0 for s in seeds])), paired=True)",
      "        return Interval(*mean_ci(np.array([np.mean(list(a.values())) / np.mean(list(b.values())) - 1.0\n"
      "                                           for s in seeds])), paired=True)", R48_STATS, kind="stats"),
    m("r48-stats-bootstrap-unseeded", "evaluation/stats.py",
      "    rng = np.random.default_rng(seed)", "    rng = np.random.default_rng()", R48_STATS, kind="stats"),
    m("r48-stats-bootstrap-seed-ignored", "evaluation/stats.py",
      "    rng = np.random.default_rng(seed)", "    rng = np.random.default_rng(0)", R48_STATS, kind="stats"),
    m("r48-stats-bootstrap-90-percent", "evaluation/stats.py",
      "np.percentile(samples, [2.5, 97.5])", "np.percentile(samples, [5.0, 95.0])", R48_STATS, kind="stats"),
    m("r48-stats-bootstrap-runs-fixed", "evaluation/stats.py",
      "        r = rng.integers(runs.shape[0], size=runs.shape[0])", "        r = np.arange(runs.shape[0])",
      R48_STATS, kind="stats"),
    m("r48-stats-bootstrap-base-not-resampled", "evaluation/stats.py",
      "statistic(picked, np.asarray(base)[s])", "statistic(picked, np.asarray(base))", R48_STATS, kind="stats"),
    # the Perfetto trace's per-container tracks (tests/test_bite_round48_trace.py)
    m("r48-trace-episode-ends-at-the-first-end", "evaluation/trace.py",
      "    return float(max(ends)) if ends else 0.0", "    return float(min(ends)) if ends else 0.0",
      R48_TRACE, kind="trace"),
    m("r48-trace-tokens-timed-on-container-0", "evaluation/trace.py",
      "        step_ends = ends[log.container[r]]", "        step_ends = ends[0]", R48_TRACE, kind="trace"),
    m("r48-trace-iteration-stamped-at-its-end", "evaluation/trace.py",
      '"ts": (end - dt) * US, "dur": dt * US,', '"ts": end * US, "dur": dt * US,', R48_TRACE, kind="trace"),
    m("r48-trace-prefill-only-is-idle", "evaluation/trace.py",
      '            ran = values["num_decode_tokens"] or values["num_prefill_tokens"]',
      '            ran = values["num_decode_tokens"]', R48_TRACE, kind="trace"),
    m("r48-trace-container-tracks-from-1", "evaluation/trace.py",
      '"args": {"name": f"container {c}"}})', '"args": {"name": f"container {c + 1}"}})', R48_TRACE, kind="trace"),
    m("r48-trace-one-kv-counter", "evaluation/trace.py",
      '"name": f"KV blocks used, container {c}"', '"name": "KV blocks used, container 0"', R48_TRACE, kind="trace"),
    # the learning agents' action bounds (tests/test_bite_round48_actions.py)
    m("r48-window-linear", "rl/wrappers.py",
      "    window = math.exp(math.log(window_min) + frac * (math.log(window_max) - math.log(window_min)))",
      "    window = window_min + frac * (window_max - window_min)", R48_ACTIONS, kind="rl"),
    m("r48-window-unclipped", "rl/wrappers.py",
      "    frac = (_clip_unit(float(value)) + 1.0) / 2.0", "    frac = (float(value) + 1.0) / 2.0",
      R48_ACTIONS, kind="rl"),
    m("r48-window-clipped-to-half", "rl/wrappers.py",
      "    frac = (_clip_unit(float(value)) + 1.0) / 2.0",
      "    frac = (max(0.0, _clip_unit(float(value))) + 1.0) / 2.0",
      R48_ACTIONS, kind="rl"),
    m("r48-window-ignores-the-running-load", "rl/wrappers.py",
      '(load + want.cumsum()).searchsorted(window, side="right")',
      '(want.cumsum()).searchsorted(window, side="right")', R48_ACTIONS, kind="rl"),
    m("r48-window-past-the-free-slots", "rl/wrappers.py",
      "    return admit_first(obs, min(by_window, fcfs_count(obs)))", "    return admit_first(obs, by_window)",
      R48_ACTIONS, kind="rl"),
    m("r48-window-reads-the-last-value", "rl/wrappers.py",
      "        value = float(np.asarray(action, dtype=np.float64).reshape(-1)[0])",
      "        value = float(np.asarray(action, dtype=np.float64).reshape(-1)[-1])", R48_ACTIONS, kind="rl"),
    m("r48-count-past-the-visible-queue", "rl/wrappers.py",
      "    return admit_first(obs, min(int(count), visible_queue(obs).shape[0]))",
      "    return admit_first(obs, int(count))", R48_ACTIONS, kind="rl"),
    m("r48-score-target-unclipped", "rl/wrappers.py",
      "    target = low + (_clip_unit(float(values[width])) + 1.0) / 2.0 * (high - low)",
      "    target = low + (float(values[width]) + 1.0) / 2.0 * (high - low)", R48_ACTIONS, kind="rl"),
    m("r48-score-too-long-accepted", "rl/wrappers.py",
      "    if values.size != width + 1:", "    if values.size < width + 1:", R48_ACTIONS, kind="rl"),
    m("r48-residual-target-floor-zero", "rl/wrappers.py",
      "        target = max(0.05, base.memory_target(obs) + residual[width] * (high - low) / 2.0)",
      "        target = max(0.0, base.memory_target(obs) + residual[width] * (high - low) / 2.0)",
      R48_ACTIONS, kind="rl"),
    m("r48-params-weight-not-floored", "rl/wrappers.py",
      "    return (max(0.0, (1.0 + p.output_weight) * math.exp(a[0]) - 1.0),",
      "    return ((1.0 + p.output_weight) * math.exp(a[0]) - 1.0,", R48_ACTIONS, kind="rl"),
    m("r48-params-target-floor-low", "rl/wrappers.py",
      "            max(0.05, p.target_base + a[2]),", "            max(0.01, p.target_base + a[2]),",
      R48_ACTIONS, kind="rl"),
    m("r48-params-slope-unclipped", "rl/wrappers.py",
      "max(0.05, p.target_base + a[2]), _clip_unit(p.target_slope + a[3]))", "max(0.05, p.target_base + a[2]), "
      "p.target_slope + a[3])", R48_ACTIONS, kind="rl"),
    m("r48-params-actions-unclipped", "rl/wrappers.py",
      "    a = [_clip_unit(v) * reach for v, reach", "    a = [v * reach for v, reach", R48_ACTIONS, kind="rl"),
    m("r48-params-length-unchecked", "rl/wrappers.py",
      "    if len(values) != len(PARAMS_REACH) or not all(", "    if not all(",
      R48_ACTIONS, kind="rl"),
    # count-mode action masks (tests/test_bite_round48_actions.py)
    m("r48-count-mask-strict", "envs/actions.py",
      "    return np.arange(num_values) <= max(num_visible, 0)",
      "    return np.arange(num_values) < max(num_visible, 0)",
      R48_ACTIONS, "-k", "mask", kind="rl"),
    m("r48-count-mask-allows-all", "envs/actions.py",
      "    return np.arange(num_values) <= max(num_visible, 0)", "    return np.ones(num_values, dtype=bool)",
      R48_ACTIONS, "-k", "mask", kind="rl"),
    m("r48-count-mask-whole-queue", "rl/wrappers.py",
      "        return count_action_masks(self.action_space.n, self.env.unwrapped.num_visible)",
      "        return count_action_masks(self.action_space.n, self.env.unwrapped.engine.waiting.size)",
      R48_ACTIONS, "-k", "mask", kind="rl"),
    m("r48-count-mask-agent-by-window", "rl/agent.py",
      "        visible = visible_queue(obs).shape[0]", '        visible = obs["queue"].shape[0] // len(QUEUE_FEATURES)',
      R48_ACTIONS, "-k", "mask", kind="rl"),
    # the oracle's decision points and tails (tests/test_bite_round48_oracle.py)
    m("r48-oracle-points-truncated", "benchmark/oracle.py",
      "    points = {round(k * horizon / (budget.replans + 1))",
      "    points = {int(k * horizon / (budget.replans + 1))",
      R48_ORACLE, kind="bench"),
    m("r48-oracle-points-to-the-end", "benchmark/oracle.py",
      "    points = {round(k * horizon / (budget.replans + 1))", "    points = {round(k * horizon / budget.replans)",
      R48_ORACLE, kind="bench"),
    m("r48-oracle-point-at-the-reset", "benchmark/oracle.py",
      "for k in range(1, budget.replans + 1)} - {0}", "for k in range(1, budget.replans + 1)}",
      R48_ORACLE, kind="bench"),
    m("r48-oracle-one-more-watcher", "benchmark/oracle.py",
      "    best = sorted(sweep, key=lambda label: -sweep[label])[: budget.width]",
      "    best = sorted(sweep, key=lambda label: -sweep[label])[: budget.width + 1]", R48_ORACLE, kind="bench"),
    m("r48-oracle-worst-watchers", "benchmark/oracle.py",
      "    best = sorted(sweep, key=lambda label: -sweep[label])[: budget.width]",
      "    best = sorted(sweep, key=lambda label: sweep[label])[: budget.width]", R48_ORACLE, kind="bench"),
    m("r48-oracle-switches-on-ties", "benchmark/oracle.py",
      "                if end > plan.total:", "                if end >= plan.total:", R48_ORACLE, kind="bench"),
    m("r48-oracle-watchers-do-not-watch", "benchmark/oracle.py",
      "            watcher.act(obs)\n", "            pass\n", R48_ORACLE, kind="bench"),
    # the scorer's default weights (tests/test_bite_round48_scorer_gains.py)
    m("r48-scorer-output-weight-half", "policies/scorer.py",
      "    output_weight: float = param(1.0,", "    output_weight: float = param(0.5,", R48_SCORER, kind="policy"),
    m("r48-scorer-ageing-by-default", "policies/scorer.py",
      "    wait_weight: float = param(0.0,", "    wait_weight: float = param(0.001,", R48_SCORER, kind="policy"),
    m("r48-scorer-target-below-the-cache", "policies/scorer.py",
      "    target_base: float = param(1.0,", "    target_base: float = param(0.99,", R48_SCORER, kind="policy"),
    m("r48-scorer-target-above-the-cache", "policies/scorer.py",
      "    target_base: float = param(1.0,", "    target_base: float = param(1.01,", R48_SCORER, kind="policy"),
    m("r48-scorer-slope-up-by-default", "policies/scorer.py",
      "    target_slope: float = param(0.0,", "    target_slope: float = param(0.1,", R48_SCORER, kind="policy"),
    m("r48-scorer-slope-down-by-default", "policies/scorer.py",
      "    target_slope: float = param(0.0,", "    target_slope: float = param(-0.1,", R48_SCORER, kind="policy"),
    # gains against a reference of zero (tests/test_bite_round48_scorer_gains.py)
    m("r48-gain-zero-reference-nan", "benchmark/board.py",
      "            return 0.0 if change == 0 else math.copysign(math.inf, change)", "            return math.nan",
      R48_SCORER, kind="bench"),
    m("r48-gain-zero-reference-no-change-infinite", "benchmark/board.py",
      "            return 0.0 if change == 0 else math.copysign(math.inf, change)",
      "            return math.copysign(math.inf, change)", R48_SCORER, kind="bench"),
    m("r48-gain-zero-reference-unsigned", "benchmark/board.py",
      "            return 0.0 if change == 0 else math.copysign(math.inf, change)",
      "            return 0.0 if change == 0 else math.inf", R48_SCORER, kind="bench"),
    m("r48-normalized-no-span-zero", "benchmark/board.py",
      "        return math.nan if span == 0 else", "        return 0.0 if span == 0 else", R48_SCORER, kind="bench"),
    m("r48-headroom-zero-goodput-no-gain", "benchmark/headroom.py",
      'goodput = math.inf if policy.mean("goodput_rps") > 0 else 0.0',
      'goodput = 0.0', R48_SCORER, kind="bench"),
    m("r48-headroom-zero-goodput-always-inf", "benchmark/headroom.py",
      'goodput = math.inf if policy.mean("goodput_rps") > 0 else 0.0',
      'goodput = math.inf', R48_SCORER, kind="bench"),
    # ITL features across prefill-only iterations (tests/test_bite_round48_engine.py)
    m("r48-itl-on-prefill-steps", "engine/engine.py",
      "        if decodes:\n            self.itl_last = dt",
      "        if decodes or prefill_tokens:\n            self.itl_last = dt",
      R48_ENGINE, "-k", "itl", kind="engine"),
    m("r48-itl-first-token-is-a-gap", "engine/engine.py",
      "        if decodes:\n            self.itl_last = dt",
      "        if decodes or completes:\n            self.itl_last = dt",
      R48_ENGINE, "-k", "itl", kind="engine"),
    m("r48-itl-every-step", "engine/engine.py",
      "        if decodes:\n            self.itl_last = dt", "        if True:\n            self.itl_last = dt",
      R48_ENGINE, "-k", "itl", kind="engine"),
    # a serverless pool's decisions under the decision skip (tests/test_bite_round48_engine.py)
    m("r48-skip-asks-container-0", "envs/serving.py",
      "or self.cluster.engine.can_admit() \\", "or self.cluster.engines[0].can_admit() \\",
      R48_ENGINE, "-k", "pool or decision", kind="env"),
    m("r48-skip-asks-whenever-requests-wait", "envs/serving.py",
      "or self.cluster.engine.can_admit() \\", "or bool(self.cluster.engine.waiting.size) \\",
      R48_ENGINE, "-k", "pool or decision", kind="env"),
    m("r48-pool-ties-to-the-last-container", "engine/engine.py",
      "(busy == best_busy and e.clock < best_clock)", "(busy == best_busy and e.clock <= best_clock)",
      R48_ENGINE, "-k", "pool or decision", kind="pool"),
    # the wrappers' refusals the audit found missing (tests/test_bite_round48_actions.py)
    m("r48-negative-count-admitted", "rl/wrappers.py", "    if count < 0:\n", "    if count < -1:\n", R48_ACTIONS,
      kind="rl"),
    m("r48-rank-order-unchecked", "rl/wrappers.py", "if not (0 <= order < len(RANK_ORDERS) and",
      "if not (-len(RANK_ORDERS) <= order < len(RANK_ORDERS) and", R48_ACTIONS, kind="rl"),
    # issue 48: counts, kept runs, the env contract, Ray's address, workers of a killed parent
    m("r48-count-limit-exclusive", "servegym/validation.py", "if not whole or not low <= value <= limit:",
      "if not whole or not low < value <= limit:", "tests/test_counts.py", kind="inputs"),
    m("r48-count-accepts-fractions", "servegym/validation.py",
      "isinstance(value, float) and math.isfinite(value) and value.is_integer()))",
      "isinstance(value, float) and math.isfinite(value)))", "tests/test_counts.py", kind="inputs"),
    m("r48-expected-requests-unchecked", "workloads/synthetic.py",
      '        expected_requests("arrivals", self.arrivals.mean_rate(), self.duration_s)', "", "tests/test_counts.py",
      kind="inputs"),
    m("r48-containers-uncapped", "pool/cluster.py", 'count("num_containers", self.num_containers, "containers")',
      'count("num_containers", self.num_containers, "steps")', "tests/test_counts.py", kind="inputs"),
    m("r48-trace-long-rows", "workloads/trace.py", "            if len(row) > len(header):",
      "            if len(row) > len(header) + 1:", "tests/test_counts.py", kind="inputs"),
    m("r48-trace-tokens-uncapped", "workloads/trace.py", "            or np.any(counts > MAX_TOKENS) or",
      "            or", "tests/test_counts.py", kind="inputs"),
    m("r48-kept-runs-not-stored", "evaluation/regime.py", "run_stored(_run_quietly, todo, workers, store,",
      "run_stored(_run_quietly, todo, workers, None,", "tests/test_kept_runs.py", kind="inputs"),
    m("r48-kept-runs-fresh-ignored", "servegym/cli.py",
      "        if args.fresh:\n            store.clear()\n        held", "        held", "tests/test_kept_runs.py",
      kind="inputs"),
    m("r48-truncated-episode-steppable", "envs/serving.py",
      "        self._terminated, self._truncated = terminated, truncated\n",
      "        self._terminated = terminated\n",
      "tests/test_env_contract.py", kind="env"),
    m("r48-reset-options-ignored", "envs/serving.py", "        check_reset_options(options)\n", "",
      "tests/test_env_contract.py", kind="env"),
    m("r48-task-id-unlocked", "envs/mixture.py", "    if id_task is not None and not unlocked:\n        _check_locked(",
      "    if False:\n        _check_locked(", "tests/test_env_contract.py", kind="env"),
    m("r51-unlocked-ignored", "envs/mixture.py", "    if id_task is not None and not unlocked:\n        _check_locked(",
      "    if id_task is not None:\n        _check_locked(", "tests/test_env_contract.py", kind="env"),
    m("r48-split-without-task", "envs/mixture.py", "    if split is not None and task is None:",
      "    if split is not None and task is None and False:", "tests/test_env_contract.py", kind="env"),
    m("r48-ray-address-unprobed", "evaluation/ray_executor.py",
      "            probe_address(self.address)  # Ray", "            pass  # Ray", "tests/test_ray_executor.py", "-k",
      "address", kind="inputs"),
    m("r48-workers-outlive-parent", "evaluation/executor.py", "    _die_with_parent()\n    try:", "    try:",
      "tests/test_cli_lifecycle.py", "-k", "killed_outright or busy_with", kind="inputs"),
    m("r48-profile-table-a-number", "backends/token_model.py", 'if "tuple" in str(f.type):',
      'if isinstance(value, tuple | list):', "tests/test_bad_input.py", kind="inputs"),
]


def _more_mutations() -> list[Mutation]:
    """Mutations kept beside this file, one module per area in ``benchmarks/mutants/`` (each defines ``MUTATIONS``,
    a list of ``(id, file, old, new, targets, kind)`` tuples), so that areas grow without editing one long list."""
    found = []
    for path in sorted((Path(__file__).resolve().parent / "mutants").glob("*.py")):
        namespace: dict = {}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        found += [Mutation(id, file, old, new, tuple(targets), kind)
                  for id, file, old, new, targets, kind in namespace["MUTATIONS"]]
    return found


MUTATIONS += _more_mutations()


# ---------------------------------------------------------------------------------------------------- running
def python_executable() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def validate(mutations: list[Mutation]) -> list[str]:
    """Problems with the mutations' texts against the current working tree (empty when all is well)."""
    problems, seen = [], set()
    for mut in mutations:
        if mut.id in seen:
            problems.append(f"{mut.id}: duplicate id")
        seen.add(mut.id)
        path = ROOT / mut.file
        if not path.is_file():
            problems.append(f"{mut.id}: {mut.file} does not exist")
            continue
        count = path.read_text().count(mut.old)
        if count != 1:
            problems.append(f"{mut.id}: the old text occurs {count} times in {mut.file} (must be exactly once):\n"
                            f"    {mut.old!r}")
        if mut.old == mut.new:
            problems.append(f"{mut.id}: old and new text are the same")
        for target in mut.targets:
            if target.startswith("tests/") and not (ROOT / target.split("::")[0]).is_file():
                problems.append(f"{mut.id}: target {target} does not exist")
    return problems


def make_scratch(parent: Path, name: str) -> Path:
    """Copy the repository (without .venv, .git and caches) and link the package-dir mapping into servegym/."""
    repo = parent / name
    shutil.copytree(ROOT, repo, ignore=ignored_in_scratch, symlinks=True)
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in mapping.items():
        parts = package.split(".")
        if len(parts) != 2 or parts[0] != "servegym":
            continue
        link = repo / "servegym" / parts[1]
        if link.exists() or link.is_symlink():
            raise RuntimeError(f"{link} already exists in the scratch copy")
        link.symlink_to(Path("..") / folder, target_is_directory=True)
    return repo


def subprocess_env() -> dict[str, str]:
    # The engine runs interpreted from the scratch copy's source (no compiled build is copied there).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env.update(PYTHONDONTWRITEBYTECODE="1", SERVEGYM_MUTATION="1", SERVEGYM_ENGINE="python")
    return env


def check_imports(repo: Path) -> None:
    """Fail unless every servegym module imported from the scratch copy comes from the scratch copy."""
    code = ("import servegym.runner, servegym.policies, servegym.metrics, sys; "
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items() "
            "if n.startswith('servegym') and getattr(m, '__file__', None)))")
    out = subprocess.run([python_executable(), "-c", code], cwd=repo, env=subprocess_env(), capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"importing servegym from the scratch copy failed:\n{out.stderr}")
    files = [Path(line) for line in out.stdout.split()]
    outside = [f for f in files if not f.resolve().is_relative_to(repo.resolve())]
    if not files or outside:
        raise RuntimeError(f"the scratch copy imports servegym from outside itself: {outside[:5]}")


def run_pytest(repo: Path, targets: tuple[str, ...], timeout: float) -> tuple[int, str, float]:
    cmd = [python_executable(), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *targets]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=repo, env=subprocess_env(), capture_output=True, text=True, timeout=timeout,
                             check=False)
    except subprocess.TimeoutExpired:
        return -1, "timed out", time.perf_counter() - start
    return out.returncode, out.stdout + out.stderr, time.perf_counter() - start


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0]
    return output.strip().splitlines()[-1] if output.strip() else ""


def run_mutation(repo: Path, mut: Mutation, timeout: float) -> tuple[str, str, float]:
    path = repo / mut.file
    original = path.read_text()
    if original.count(mut.old) != 1:
        return "ERROR", f"old text occurs {original.count(mut.old)} times in the scratch copy", 0.0
    try:
        path.write_text(original.replace(mut.old, mut.new))
        rc, output, seconds = run_pytest(repo, mut.targets, timeout)
    finally:
        path.write_text(original)
    if rc == 0:
        return "SURVIVED", "targeted tests pass", seconds
    if rc == -1:
        return "CAUGHT", "timed out (a hang)", seconds
    if rc == 5:
        return "ERROR", "no tests collected: check the targets", seconds
    return "CAUGHT", first_failure(output), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--check", action="store_true", help="only check that each old text occurs exactly once")
    parser.add_argument("--only", action="append", default=[], metavar="ID", help="run only these ids (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel scratch copies (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutation before it counts as a hang")
    parser.add_argument("--baseline-timeout", type=float, default=1800.0,
                        help="seconds for the unmutated run of every target file together (default 1800)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args(argv)

    wanted = {i for arg in args.only for i in arg.split(",") if i}
    unknown = wanted - {mut.id for mut in MUTATIONS}
    if unknown:
        print(f"unknown mutation id(s): {sorted(unknown)}", file=sys.stderr)
        return 2
    chosen = [mut for mut in MUTATIONS if not wanted or mut.id in wanted]
    if args.list:
        for mut in chosen:
            print(f"{mut.id:38s} {mut.kind:14s} {mut.file:26s} {' '.join(mut.targets)}")
        print(f"{len(chosen)} mutations")
        return 0
    problems = validate(chosen)
    if problems:
        print("mutation list out of date with the source:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    if args.check:
        print(f"all {len(chosen)} mutations apply (each old text occurs exactly once)")
        return 0

    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="servegym-mutation-"))
    try:
        jobs = max(1, min(args.jobs, len(chosen)))
        repos = [make_scratch(scratch, f"repo{j}") for j in range(jobs)]
        check_imports(repos[0])
        files = tuple(sorted({t.split("::")[0] for mut in chosen for t in mut.targets if t.startswith("tests/")}))
        rc, output, seconds = run_pytest(repos[0], files, args.baseline_timeout)
        if rc != 0:
            print(f"baseline failed: the unmutated tests must pass first ({' '.join(files)}):\n{output[-3000:]}",
                  file=sys.stderr)
            return 2
        print(f"baseline: {' '.join(files)} pass on the unmutated copy ({seconds:.1f} s)")
        free: Queue[Path] = Queue()
        for repo in repos:
            free.put(repo)
        results: dict[str, tuple[str, str, float]] = {}

        def work(mut: Mutation) -> None:
            repo = free.get()
            try:
                results[mut.id] = run_mutation(repo, mut, args.timeout)
            finally:
                free.put(repo)
            verdict, detail, secs = results[mut.id]
            print(f"[{len(results):3d}/{len(chosen)}] {verdict:8s} {mut.id:38s} {secs:5.1f}s  {detail}", flush=True)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(work, chosen))
    finally:
        if args.keep:
            print(f"scratch kept at {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    caught = [mut.id for mut in chosen if results[mut.id][0] == "CAUGHT"]
    survived = [mut.id for mut in chosen if results[mut.id][0] == "SURVIVED"]
    errors = [mut.id for mut in chosen if results[mut.id][0] == "ERROR"]
    print(f"\nscore: {len(caught)}/{len(chosen)} caught ({time.perf_counter() - started:.0f} s)")
    if survived:
        print(f"survived: {', '.join(survived)}")
    if errors:
        print(f"errors: {', '.join(errors)}")
    return 2 if errors else (1 if survived else 0)


if __name__ == "__main__":
    sys.exit(main())
