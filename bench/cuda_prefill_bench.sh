#!/usr/bin/env bash
# GPU prefill benchmark (not a test), for a machine with an NVIDIA GPU: prompt tok/s of a
# Qwen3-Next-80B-A3B-shaped synth (random weights, 4-bit experts, 8-bit dense; LAYERS layers)
# with every weight in VRAM and under a VRAM budget (VRAM, the host tier holding the model), for
# each binary named in BINS (e.g. the integer GEMM's build beside the one before it), beside the
# kernels alone: bench_cuda_matvec's prefill forms (direct, cuBLAS, integer) and a prompt chunk's
# routed experts run per expert against cuda::int_experts.
#
#   bench/cuda_prefill_bench.sh
#
# Environment: BINS (moestream binaries, default build/moestream), MATVEC (bench_cuda_matvec,
# default build/bench/bench_cuda_matvec), BENCH_DIR (where the model is written, default
# /var/tmp/moestream-bench), LAYERS (24), PROMPTS (512,4096), VRAM (6G), REPEAT (3), KEEP=1
# keeps the model.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BINS=${BINS:-$ROOT/build/moestream}
MATVEC=${MATVEC:-$ROOT/build/bench/bench_cuda_matvec}
WORK=${BENCH_DIR:-/var/tmp/moestream-bench}
LAYERS=${LAYERS:-24}
PROMPTS=${PROMPTS:-512,4096}
VRAM=${VRAM:-6G}
REPEAT=${REPEAT:-3}
MODEL=$WORK/prefill-80b-$LAYERS
export MOESTREAM_USAGE=off

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== kernels: a prompt chunk's routed experts (80B shape), then the prefill forms"
"$MATVEC" "prefill experts"
"$MATVEC" gemm | grep -E "q4|q8" | grep -E "T=(16|32|64|128|256|512) "

mkdir -p "$WORK"
[ -d "$MODEL" ] || "${BINS%% *}" synth --like 80b-a3b --layers "$LAYERS" --out "$MODEL" > /dev/null
du -sh "$MODEL"
for bin in $BINS; do
  for budget in all "$VRAM"; do
    extra=()
    [ "$budget" != all ] && extra=(--vram "$budget")
    echo "== $bin, VRAM $budget"
    "$bin" bench --model "$MODEL" --device cuda "${extra[@]}" --prompt "$PROMPTS" --tokens 0 --repeat "$REPEAT" 2>&1 |
      grep -E "^pp[0-9]|at load|error|reads"
  done
done
[ "${KEEP:-0}" = 1 ] || rm -rf "$MODEL"
