#!/usr/bin/env bash
# The GPU check, one script, under 9 minutes on an H200: the GPU tests (tests/gpu), then the LLaDA-8B-shaped step
# benchmark (benchmarks/bench_gpu.py: steps and constrained, then torch.compile), each under its own time limit so
# one overrun cannot eat the others. Writes into OUT_DIR (first argument, else $OUT, else ./gpu_check_out):
#   env.txt                 nvidia-smi, torch / triton / CUDA versions
#   tests_gpu.xml, .txt     pytest's junit report and output of tests/gpu
#   steps/bench_gpu.json    step times by kind at B = 1, 8, 32, 64, roofline ratios, tokens/s, memory, launches,
#                           constrained vs unconstrained
#   compile/bench_gpu.json  eager vs torch.compile (default, reduce-overhead) at B = 8
#   *.log                   each command's output; status.txt: each stage's exit status (124: its time limit)
# Needs a Python with a CUDA build of torch, Triton and this package's dependencies (PYTHON, else .venv/bin/python,
# else python; BENCH_ARGS: extra arguments for bench_gpu.py); the package itself is installed (pip install -e . --no-deps) when it does not import.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu_check_out}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python; fi
fi
read -r -a EXTRA <<< "${BENCH_ARGS:-}"  # e.g. BENCH_ARGS="--tiny --batches 1,2": a dry run of the script on a CPU
: > "$OUT_DIR/status.txt"

stage() {  # stage NAME SECONDS COMMAND...: run with a time limit, log, record the exit status
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start))" | tee -a "$OUT_DIR/status.txt"
}

{
  nvidia-smi || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
} > "$OUT_DIR/env.txt" 2>&1
"$PY" -c "import dllm_constrain.engine" 2>/dev/null || "$PY" -m pip install --no-deps --no-build-isolation -e . \
  > "$OUT_DIR/install.log" 2>&1

stage tests_gpu 120 "$PY" -m pytest tests/gpu -q -rs -p no:cacheprovider --junitxml="$OUT_DIR/tests_gpu.xml"
cp "$OUT_DIR/tests_gpu.log" "$OUT_DIR/tests_gpu.txt"
stage bench_steps 300 "$PY" benchmarks/bench_gpu.py --sections steps,constrained --out "$OUT_DIR/steps" "${EXTRA[@]}"
stage bench_compile 90 "$PY" benchmarks/bench_gpu.py --sections compile --out "$OUT_DIR/compile" "${EXTRA[@]}"
cat "$OUT_DIR/status.txt"
