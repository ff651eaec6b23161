#!/usr/bin/env bash
# Decode tok/s of pycoder-moe with bf16, 8-bit and 4-bit experts (all experts resident), medians
# of 5 runs of 256 greedy tokens, next to the machine's memory bandwidth (bench_quant_matmul
# prints it). Usage: bench/decode_pycoder.sh [SHARED_DIR]   (default ../shared)
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${1:-../shared}
bin=./build/moestream
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ninja -C build moestream bench_quant_matmul >/dev/null
for bits in 16 8 4; do
  "$bin" convert --from "$shared/models/pycoder-moe" --out "$work/q$bits" --expert-bits "$bits" >/dev/null
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "pycoder-moe decode, 256 tokens, threads=${MOESTREAM_THREADS:-all}"
for bits in 16 8 4; do
  rates=$(for i in 1 2 3 4 5; do
    "$bin" run --model "$work/q$bits" --prompt "def parse_args(argv):" --max-tokens 256 --ignore-eos --stats 2>&1 >/dev/null |
      sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p'
  done | median)
  echo "experts ${bits}-bit: ${rates} tok/s (median of 5)"
done
./build/bench/bench_quant_matmul | head -3
