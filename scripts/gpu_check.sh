#!/usr/bin/env bash
# One command for a CUDA machine: every CUDA test, the kernel benchmarks, a calibration
# and the executor's benchmarks on the device, written to one report folder.
#
#   bash scripts/gpu_check.sh [REPORT_DIR]        (make gpu-check; default var/gpu-check)
#
# It uses the python3 on the PATH with the torch, Triton and transformers found there
# (it installs nothing from a registry: the machine may have no network). Wheels of
# the packages the tests import beyond torch (Django, asgiref, sqlparse, llguidance)
# are installed from .whl/ when that folder exists and they are missing; `make gpu-wheels` fills it on a
# machine with a registry. Every step has its own time limit and its exit status goes in
# the report; the command fails when a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
REPORT=${1:-var/gpu-check}
mkdir -p "$REPORT"
REPORT=$(cd "$REPORT" && pwd)
SUMMARY=$REPORT/summary.txt
: >"$SUMMARY"
PY=${PYTHON:-python3}

say() { echo "$*" | tee -a "$SUMMARY"; }

# The project imports as `shunter` from this checkout, whatever python3 this is.
SITE=$(mktemp -d)
ln -s "$REPO" "$SITE/shunter"
if [ -d .whl ] && ! "$PY" -c "import django, llguidance" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl ||
    say "wheels from .whl/ did not install"
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Tests that start `shunter` as a program find it beside the interpreter.
BIN=$(mktemp -d)
printf '#!/bin/sh\nexec %s -c "import sys; from shunter.project.cli import main; sys.exit(main())" "$@"\n' \
  "$(command -v "$PY")" >"$BIN/shunter"
chmod +x "$BIN/shunter"
export PATH="$BIN:$PATH"

failed=0
# Four test processes when pytest-xdist is there: the CPU-side tests dominate the time.
XDIST=""
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 4"
# GPU_CHECK_STEPS="tests serve" runs only those steps (a rerun of what failed).
STEPS=${GPU_CHECK_STEPS:-}
# GPU_CHECK_DEVICE=cpu tries the end-to-end step on a machine without one.
DEVICE=${GPU_CHECK_DEVICE:-cuda}
# step NAME LIMIT_S COMMAND...: run one step, its output to REPORT/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "$STEPS" ] && [[ " $STEPS " != *" ${name%%-*} "* && " $STEPS " != *" $name "* ]]; then
    return 0
  fi
  local start=$SECONDS rc
  if declare -F "$1" >/dev/null; then
    "$@" >"$REPORT/$name.log" 2>&1  # a function here: its commands carry their own limits
  else
    timeout "$limit" "$@" >"$REPORT/$name.log" 2>&1
  fi
  rc=$?
  say "$(printf '%-16s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - start))" "$*")"
  [ "$rc" -eq 0 ] || failed=1
  return 0
}

say "gpu-check at $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
  2>&1 | sed 's/^/device: /' | tee -a "$SUMMARY"
"$PY" - <<'EOF' 2>&1 | tee -a "$SUMMARY"
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {torch.cuda.is_available()}")
try:
    import triton
    print(f"triton {triton.__version__}")
except ImportError as e:
    print(f"triton: {e}")
EOF

step tests 240 "$PY" -m pytest -q -p no:cacheprovider -o addopts=-ra $XDIST \
  --junitxml="$REPORT/junit.xml" tests/kernels tests/engine/exec tests/engine/calibrate
step bench-kernels 100 shunter bench kernels
MODELS=$REPORT/models
step model-init 40 shunter model init --preset small-llama --out "$MODELS/small-llama"
step calibrate 100 shunter engine calibrate --device cuda --model "$MODELS/small-llama" \
  --out "$REPORT/profile.json"
step bench-executor 60 shunter bench executor --device cuda --model "$MODELS/small-llama"
step bench-remap 60 shunter bench remap-exec --device cuda --model "$MODELS/small-llama"
# Async scheduling against the sequential loop at batch 32, alone and beside a CPU hog.
step bench-pipeline 90 shunter bench pipeline --device cuda --model "$MODELS/small-llama"
# llama-3-8b's layer shapes (bf16), four of its 32 layers: engine against transformers on
# the device at batch 64, and remapping's streamed layers at that size.
step model-init-8b 90 shunter model init --preset llama-3-8b --layers 4 --out "$MODELS/llama-3-8b-4l"
step bench-exec-8b 120 shunter bench executor --device cuda --model "$MODELS/llama-3-8b-4l" \
  --prompts 64 --prompt-tokens 128 --max-tokens 32
step bench-remap-8b 90 shunter bench remap-exec --device cuda --model "$MODELS/llama-3-8b-4l" \
  --lent 1,2 --prompts 64
# Decode steps at batch 1/16/64/256: CUDA graphs against eager, and the HBM roofline.
step bench-graphs-8b 120 shunter bench graphs --device cuda --model "$MODELS/llama-3-8b-4l"
# End to end on the device: the demo's two models (8 layers each, a 12 MiB arena with
# remapping, so bursts rotate KV to host memory and borrow the temporal model's layers)
# behind `shunter engine --device cuda`, loaded by `shunter bench serve`.
serve_e2e() {
  local port=8123 pid ok=""
  mkdir -p "$MODELS"
  shunter model init --preset tiny-llama --layers 8 --out "$MODELS/tiny-llama" >/dev/null &&
    shunter model init --preset tiny-qwen2 --layers 8 --out "$MODELS/tiny-qwen2" >/dev/null ||
    return 1
  mkdir -p "$MODELS"
  shunter engine --device "$DEVICE" --port "$port" --hbm-budget 12582912 --remap \
    --model "tiny-llama=$MODELS/tiny-llama:temporal" \
    --model "tiny-qwen2=$MODELS/tiny-qwen2:spatial" >"$REPORT/engine.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then ok=1; break; fi
    sleep 0.5
  done
  if [ -z "$ok" ]; then kill "$pid"; tail -20 "$REPORT/engine.log"; return 1; fi
  local rc=0
  for model in tiny-llama tiny-qwen2; do
    timeout 60 shunter bench serve --base-url "http://127.0.0.1:$port" --model "$model" --rps 4,32 \
      --num-requests 64 --dataset synthetic --input-len 16..256 --output-len 16..128 || rc=1
  done
  curl -s "http://127.0.0.1:$port/admin/state" | "$PY" -c '
import json, sys
state = json.load(sys.stdin)
print(json.dumps({k: state[k] for k in ("memory", "transfers", "remap") if k in state})[:3000])'
  kill -TERM "$pid"
  wait "$pid"
  grep -i "cuda graphs" "$REPORT/engine.log"  # what the capture took, or why it failed
  tail -5 "$REPORT/engine.log"
  return "$rc"
}
step serve 150 serve_e2e
rm -rf "$MODELS"

[ -f "$REPORT/tests.log" ] && grep -E "passed|failed|error" "$REPORT/tests.log" | tail -1 | sed 's/^/tests: /' | tee -a "$SUMMARY"
# One report file: the summary, then each step's output.
{
  cat "$SUMMARY"
  for log in "$REPORT"/*.log; do
    printf '\n===== %s =====\n' "$(basename "$log" .log)"
    cat "$log"
  done
} >"$REPORT/report.txt"
say "report: $REPORT/report.txt"
exit "$failed"
