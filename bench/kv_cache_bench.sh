#!/usr/bin/env bash
# KV cache formats (--kv-bits, docs/kv_cache.md) on the CPU: decode tok/s after 1k, 8k and 32k
# tokens of context with float32, bf16 and K4/V3 caches, beside the KV bytes a position takes
# (a decode step at depth D reads D x that) and the attention kernel alone at the 80B's heads
# (bench_cpu_attention: ms a step, GB/s of cache read, against the memory read bandwidth).
#
#   MODEL=DIR DEPTHS=1024,8192 bench/kv_cache_bench.sh
#
# Environment: MOESTREAM (binary, default build/moestream), ATTENTION (bench_cpu_attention,
# default build/bench/bench_cpu_attention; "none" skips it), MODEL (default the embedded
# pycoder-moe-q4), DEPTHS (default 1024,8192,32768), FORMATS ("32,32 16,16 4,3"), TOKENS (64),
# REPEAT (3). Run it with nothing else on the machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MOESTREAM:-$ROOT/build/moestream}
ATTENTION=${ATTENTION:-$ROOT/build/bench/bench_cpu_attention}
MODEL=${MODEL:-$ROOT/models/pycoder-moe-q4}
export MOESTREAM_USAGE=off
[[ $ATTENTION == none ]] || "$ATTENTION"
for kb in ${FORMATS:-32,32 16,16 4,3}; do
  echo "== $MODEL --kv-bits $kb"
  "$BIN" bench --model "$MODEL" --prompt 0 --tokens "${TOKENS:-64}" --depth "${DEPTHS:-1024,8192,32768}" \
    --context 32768 --kv-bits "$kb" --repeat "${REPEAT:-3}" | grep -E "^(tg|KV|memory|a decode)"
done
