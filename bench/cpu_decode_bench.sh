#!/usr/bin/env bash
# CPU compute with every weight in RAM (not a test): `moestream bench` on the 16-layer
# Qwen3-Next-80B-A3B-shaped synth (every expert read into its pool before timing) beside
# llama-bench on the same shape, at 2 threads and 1, prompts of 16/128/512 tokens and 64 decode
# steps; then pycoder-moe-q4 decode at 1 and 2 threads. moestream bench prints the machine's read
# bandwidth measured in the same run and each decode as GB/s of weights read against it.
#
#   MODEL=<engine dir> GGUF=<synth.gguf> LLAMA_BENCH=<llama-bench> bench/cpu_decode_bench.sh
#
# Make the models with `moestream synth --like 80b-a3b --layers 16 --expert-bits 4 --dense-bits 8`
# and ../shared/peers/synth_gguf.py. Environment: MOESTREAM (default build/moestream), PROMPTS
# (16,128,512), TOKENS (64), REPEAT (3). Needs a quiet machine: nothing else on the cores.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MOESTREAM:-$ROOT/build/moestream}
PROMPTS=${PROMPTS:-16,128,512}
TOKENS=${TOKENS:-64}
REPEAT=${REPEAT:-3}
: "${MODEL:?MODEL=<engine dir of the 16-layer synth>}"

for t in 2 1; do
  echo "== moestream, $t threads"
  MOESTREAM_THREADS=$t "$BIN" bench --model "$MODEL" --prompt "$PROMPTS" --tokens "$TOKENS" --repeat "$REPEAT"
  if [[ -n ${GGUF:-} && -n ${LLAMA_BENCH:-} ]]; then
    echo "== llama.cpp, $t threads"
    LD_LIBRARY_PATH=$(dirname "$LLAMA_BENCH") "$LLAMA_BENCH" -m "$GGUF" -p "$PROMPTS" -n "$TOKENS" -t "$t" -r "$REPEAT" |
      grep -E "^\| (model|qwen)"
  fi
done
for t in 1 2; do
  echo "== pycoder-moe-q4, $t threads"
  MOESTREAM_THREADS=$t "$BIN" bench --model "$ROOT/models/pycoder-moe-q4" --prompt 128 --tokens "$TOKENS" --repeat 5 | tail -2
done
