#!/usr/bin/env bash
# One-shot check of the real backend on a GPU: calibrate, fidelity, and a report folder (issue 16, part 7).
#
# Usage: benchmarks/gpu_check.sh [CHECKPOINT]
#
#   CHECKPOINT, or $SERVEGYM_CHECKPOINT: a local Hugging Face checkpoint folder to load; default: the
#       llama-3.2-3b preset (the TWP paper's architecture, seeded random weights, nothing downloaded).
#   $SERVEGYM_REPORT_DIR: the report folder (default: out/gpu_check).
#   $PYTHON: the interpreter servegym is installed in (default: the repository's .venv/bin/python when it
#       exists, else python3); it must import servegym, torch and transformers.
#
# On a CUDA machine it runs, each stage under its own time budget (530 s in all: it fits in 9 minutes on one
# H100-class GPU, stages that overrun are cut and reported):
#   1. nvidia-smi and library versions;
#   2. host syncs: one mixed prefill + decode step, after a warm-up step, with the model's forward pass under
#      torch.cuda.set_sync_debug_mode("error"); the stage fails if anything in it synchronises with the host;
#   3. servegym calibrate: decode batches up to 128 at contexts up to 1,024 tokens, 3 repeats;
#   4. servegym fidelity: FCFS, TWP and flow control on the cpu-fidelity workload, seeds 0-2, two real
#      repeats each, real backend vs the profile just fitted (errors beside the repeat spread, ranking);
# and writes host_syncs.txt, profile.json, calibration.png, profile.samples.csv, fidelity.md/.csv,
# nvidia-smi.txt, gpu_usage.csv, versions.txt, timing.tsv, one log per stage and README.md (the summary) to the
# report folder.
#
# Without CUDA it says so, runs a tiny CPU fallback (tiny-llama, a two-batch sweep, a six-request fidelity
# run; well under a minute) so that CI exercises the script, and exits 0 if the fallback passed. The exit
# status is 1 when a stage failed or ran out of time.
set -uo pipefail

REPORT=${SERVEGYM_REPORT_DIR:-out/gpu_check}
CHECKPOINT=${1:-${SERVEGYM_CHECKPOINT:-}}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x "$REPO/.venv/bin/python" ] && PYTHON=$REPO/.venv/bin/python
fi
if ! "$PYTHON" -c 'import servegym, torch, transformers' 2> /dev/null; then
    echo "gpu_check: $PYTHON cannot import servegym, torch and transformers: install the project" \
         "(README, Quick start) or point PYTHON at the interpreter that has them" >&2
    exit 2
fi
SERVEGYM=("$PYTHON" -m servegym.cli)
STARTED=$(date +%s)
FAILED=0

mkdir -p "$REPORT" || { echo "gpu_check: cannot create report folder $REPORT" >&2; exit 1; }
printf 'stage\tstatus\tseconds\tbudget_s\n' > "$REPORT/timing.tsv"

# stage NAME BUDGET_S COMMAND...: run COMMAND under `timeout`, log to NAME.log, record status and seconds.
stage() {
    local name=$1 budget=$2 start status
    shift 2
    start=$(date +%s)
    echo "gpu_check: $name (budget ${budget} s)..."
    timeout --kill-after=15 "$budget" "$@" > "$REPORT/$name.log" 2>&1
    status=$?
    case $status in
        0) result=ok ;;
        124 | 137) result="timed out"; FAILED=1 ;;
        *) result="failed ($status)"; FAILED=1 ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$(($(date +%s) - start))" "$budget" >> "$REPORT/timing.tsv"
    echo "gpu_check: $name: $result after $(($(date +%s) - start)) s (log: $REPORT/$name.log)"
    [ "$status" -eq 0 ]
}

if [ -n "$CHECKPOINT" ] && [ ! -f "$CHECKPOINT/config.json" ]; then
    echo "gpu_check: $CHECKPOINT is not a checkpoint folder (no config.json)" >&2
    exit 2
fi
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    MODE=cuda
    MODEL=${CHECKPOINT:-llama-3.2-3b}
    CALIBRATE=(--device cuda --max-batch 128 --max-context 1024 --repeats 3)
    FIDELITY=(--device cuda --workload cpu-fidelity --policy fcfs twp flow-control --seeds 0 1 2 --repeats 2)
    BUDGETS=(30 240 200 60)  # versions and profile; calibrate; fidelity; host syncs: 530 s in all
else
    MODE=cpu-fallback
    MODEL=tiny-llama
    CALIBRATE=(--device cpu --threads 1 --max-batch 2 --max-context 32 --repeats 2)
    FIDELITY=(--device cpu --threads 1 --workload cpu-fidelity --policy fcfs --max-requests 6 --seeds 0
              --repeats 2)
    BUDGETS=(60 120 120)
    echo "gpu_check: no CUDA device visible: the CUDA path is NOT run. Running the tiny CPU fallback instead" \
         "(tiny-llama${CHECKPOINT:+; the checkpoint $CHECKPOINT is not loaded}), which only shows the script works."
fi

# 1. The machine: nvidia-smi (and GPU memory sampled every second while the later stages run), versions.
if command -v nvidia-smi > /dev/null; then
    nvidia-smi > "$REPORT/nvidia-smi.txt" 2>&1
    nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total,utilization.gpu --format=csv -l 1 \
        > "$REPORT/gpu_usage.csv" 2>&1 &
    SAMPLER=$!
    trap 'kill "$SAMPLER" 2> /dev/null' EXIT
else
    echo "nvidia-smi: not found on this machine (mode $MODE)" > "$REPORT/nvidia-smi.txt"
fi
stage versions "${BUDGETS[0]}" "$PYTHON" - "$REPO" << 'EOF'
import os, platform, subprocess, sys

print("python", platform.python_version(), sys.executable)
for name in ("numpy", "torch", "transformers"):
    try:
        print(name, __import__(name).__version__)
    except ImportError:
        print(name, "not installed")
try:
    import torch

    print("torch CUDA", torch.version.cuda, "available", torch.cuda.is_available())
    for i in range(torch.cuda.device_count()):
        print(f"cuda:{i}", torch.cuda.get_device_name(i))
    print("torch threads", torch.get_num_threads())
except ImportError:
    pass
print("cpus", os.cpu_count(), "load average", os.getloadavg())
git = ["git", "-C", sys.argv[1]]
commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout.count("\n")
print("servegym commit", commit or "unknown", f"({dirty} files changed)" if dirty else "")
EOF
cp "$REPORT/versions.log" "$REPORT/versions.txt"

# 2. Host syncs in the forward pass (the CPU profiler test sees only CPU ops; this sees what waits for the GPU).
if [ "$MODE" = cuda ]; then
    stage host_syncs "${BUDGETS[3]}" "$PYTHON" - "$MODEL" "$REPORT/host_syncs.txt" << 'EOF'
import sys
import traceback

import numpy as np
import torch

from servegym.backends.base import EMPTY, StepBatch
from servegym.backends.torch_backend import TorchBackend

model, report = sys.argv[1], sys.argv[2]
backend = TorchBackend(model, device="cuda", num_kv_blocks=256)
decodes, prompts = np.arange(8), 32 * np.arange(1, 9)  # eight requests of 32 ... 256 prompt tokens
backend.execute(StepBatch(EMPTY, EMPTY, decodes, np.zeros(8, dtype=np.int64), prompts, prompts))


def mixed(start: int, context: np.ndarray) -> StepBatch:
    """The eight decodes plus prompt tokens start ... start + 63 of request 8 (128 tokens in all)."""
    return StepBatch(decodes, context, np.array([8]), np.array([start]), np.array([64]), np.array([128]))


backend.execute(mixed(0, prompts))  # the warm-up step
# Only the forward pass is checked: the step syncs by design outside it (the one host-to-device copy of its
# index buffer, the synchronize that times the forward pass, reading the sampled tokens back).
backend.model.register_forward_pre_hook(lambda module, args: torch.cuda.set_sync_debug_mode("error"))
backend.model.register_forward_hook(lambda module, args, output: torch.cuda.set_sync_debug_mode("default"))
try:
    backend.execute(mixed(64, prompts + 1))
    found = None
except RuntimeError as err:
    if "synchronizing" not in str(err):
        raise
    found = err
finally:
    torch.cuda.set_sync_debug_mode("default")
lines = [f"model {backend.model_name} on {backend.device} ({torch.cuda.get_device_name(backend.torch_device)}), "
         f"{backend.dtype}, attention kernel {backend.attention}",
         "step: 8 decodes (33 to 257 cached tokens each) and a 64-token prefill chunk at offset 64, after one "
         "warm-up step; the forward pass under torch.cuda.set_sync_debug_mode('error')"]
if found is None:
    lines.append("host syncs in the forward pass: none")
else:
    lines += ["host syncs in the forward pass: YES, the first one raised:", f"  {found}", "  at (innermost last):",
              *traceback.format_list(traceback.extract_tb(found.__traceback__)[-6:])]
with open(report, "w") as handle:
    handle.write("\n".join(line.rstrip("\n") for line in lines) + "\n")
print(*lines, sep="\n")
sys.exit(found is not None)
EOF
fi

# 3. Calibrate; 4. fidelity against the profile just fitted.
if stage calibrate "${BUDGETS[1]}" "${SERVEGYM[@]}" calibrate --model "$MODEL" "${CALIBRATE[@]}" \
        --out "$REPORT/profile.json" --plot "$REPORT/calibration.png"; then
    stage profile "${BUDGETS[0]}" "${SERVEGYM[@]}" profile show "$REPORT/profile.json"
    stage fidelity "${BUDGETS[2]}" "${SERVEGYM[@]}" fidelity --profile "$REPORT/profile.json" --model "$MODEL" \
        "${FIDELITY[@]}" --out "$REPORT"
else
    printf 'fidelity\tskipped (no profile)\t0\t%s\n' "${BUDGETS[2]}" >> "$REPORT/timing.tsv"
fi

# The summary.
TOTAL=$(($(date +%s) - STARTED))
{
    echo "# servegym GPU check ($MODE)"
    echo
    if [ "$MODE" = cuda ]; then
        echo "Model \`$MODEL\` on CUDA, $(date -u +%Y-%m-%dT%H:%MZ), $TOTAL s in all."
    else
        echo "**The CUDA path was not run**: no CUDA device was visible on this machine. This is the CPU fallback"
        echo "(\`tiny-llama\`, a two-batch sweep, a six-request fidelity run); it shows that the script and the"
        echo "commands work, nothing about a GPU. $(date -u +%Y-%m-%dT%H:%MZ), $TOTAL s in all."
    fi
    echo
    echo "| stage | status | seconds | budget (s) |"
    echo "|---|---|---|---|"
    tail -n +2 "$REPORT/timing.tsv" | while IFS=$'\t' read -r name status seconds budget; do
        echo "| $name | $status | $seconds | $budget |"
    done
    echo
    echo "Files in this folder: $(cd "$REPORT" && ls | grep -v '^README.md$' | tr '\n' ' ')"
    if [ "$MODE" = cuda ]; then
        echo
        echo "## Host syncs in the forward pass"
        echo
        echo '```'
        cat "$REPORT/host_syncs.txt" 2> /dev/null || echo "no result: see host_syncs.log"
        echo '```'
    fi
    if [ -f "$REPORT/profile.log" ]; then
        echo
        echo "## Profile"
        echo
        echo '```'
        cat "$REPORT/profile.log"
        echo '```'
    fi
    if [ -f "$REPORT/fidelity.md" ]; then
        echo
        echo "## Fidelity"
        echo
        sed 's/^## /### /' "$REPORT/fidelity.md"
    fi
} > "$REPORT/README.md"

echo "gpu_check: $MODE finished in $TOTAL s; report in $REPORT/README.md"
if [ "$FAILED" -ne 0 ]; then
    echo "gpu_check: FAILED: a stage failed or ran out of time (see $REPORT/timing.tsv and its log)."
fi
if [ "$MODE" != cuda ]; then
    echo "gpu_check: no CUDA device: the CUDA path was not run (CPU fallback only)."
fi
exit "$FAILED"
