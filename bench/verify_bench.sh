#!/usr/bin/env bash
# What checking checksums by default costs (not a test): an 80B-shaped synth (LAYERS layers, 4-bit
# experts, ~0.87 GiB of records a layer), page cache dropped before each run, median of REPEAT,
# default (checked) against --no-verify:
#   load    `generate --max-tokens 1` with no budget: every expert and the dense weights read
#           (and checked) at load; the command's wall time
#   stream  `bench --memory BUDGET --prompt 128 --tokens 32`: a prompt of 128 tokens routes most
#           experts of every layer through pools of a fraction of them (streamed and checked), then
#           greedy decode (one expert set repeats: an upper bound of the hit rate)
#   run     pycoder-moe-q4 at --expert-slots 16, sampled text (text-driven routing, many misses)
# and the hash's own rate (XXH64 over a 1.7 MB record, hot and cold in cache) beside the memory
# bandwidth `bench` measures.
#
#   sudo bench/verify_bench.sh
#
# Environment: MOESTREAM (default build/moestream), LAYERS (4), BUDGET (2G), REPEAT (3),
# WORK (/tmp/verify-bench; the synth is kept there between runs). Needs root (drop_caches).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MOESTREAM:-$ROOT/build/moestream}
LAYERS=${LAYERS:-4}
BUDGET=${BUDGET:-2G}
REPEAT=${REPEAT:-3}
WORK=${WORK:-/tmp/verify-bench}
[[ $(id -u) == 0 ]] || { echo "needs root (drop_caches)" >&2; exit 1; }
mkdir -p "$WORK"
export MOESTREAM_USAGE=off
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

synth=$WORK/synth80b-$LAYERS
[[ -f $synth/moestream.json ]] || "$BIN" synth --like 80b-a3b --layers "$LAYERS" --out "$synth" --force > /dev/null

# The hash's rate on this machine: XXH64 of a record-sized buffer, in cache and out of it.
cat > "$WORK/xxh.cpp" <<'CPP'
#include <xxhash.h>
#include <chrono>
#include <cstdio>
#include <vector>
int main() {
  const size_t rec = 1769472, n = 2048;  // 2048 distinct records: 3.6 GB, far beyond any cache
  std::vector<unsigned char> buf(rec * n, 1);
  unsigned long long (*hash)(const unsigned char*, size_t) = [](const unsigned char* p, size_t len) {
    return (unsigned long long)XXH64(p, len, 0);
  };
  auto rate = [&](size_t stride_records) {
    unsigned long long sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) sink += hash(buf.data() + (i % stride_records) * rec, rec);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%llu", sink);
    return double(rec) * n / s / 1e9;
  };
  std::printf("XXH64 of a %.1f MB record: %.1f GB/s in cache, %.1f GB/s from memory\n", rec / 1e6, rate(1), rate(n));
  hash = [](const unsigned char* p, size_t len) { return (unsigned long long)XXH3_64bits(p, len); };
  std::printf("XXH3-64 (the library's SSE2 build; moestream's AVX2 one is faster in cache): %.1f / %.1f GB/s\n", rate(1),
              rate(n));
}
CPP
g++ -O2 -o "$WORK/xxh" "$WORK/xxh.cpp" -lxxhash
"$WORK/xxh" 2>/dev/null

timed() {  # seconds of one run of moestream with args, page cache dropped first
  drop
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" "$@" > /dev/null 2>> "$WORK/log"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

# The two modes alternate within each repeat, so that a drift of the machine hits both alike.
declare -A load pp tg run
for ((i = 0; i < REPEAT; ++i)); do
  for mode in checked unchecked; do
    flag=(); [[ $mode == unchecked ]] && flag=(--no-verify)
    load[$mode]+="$(timed generate --model "$synth" --ids 1,2 --max-tokens 1 "${flag[@]}") "
    drop
    out=$("$BIN" bench --model "$synth" --memory "$BUDGET" --prompt 128 --tokens 32 --repeat 1 "${flag[@]}" 2>> "$WORK/log")
    pp[$mode]+="$(grep -oP 'pp128\s+\K[0-9.]+' <<< "$out" | head -1) "
    tg[$mode]+="$(grep -oP 'tg32\s+\K[0-9.]+' <<< "$out" | head -1) "
    drop
    r=$("$BIN" run --prompt 'import numpy as np
def main(' --max-tokens 128 --ignore-eos --temperature 1 --seed 1 --expert-slots 16 --stats "${flag[@]}" 2>&1 > /dev/null)
    run[$mode]+="$(grep -oP 'decode \K[0-9.]+(?= tok/s)' <<< "$r" | head -1) "
  done
done
for mode in checked unchecked; do
  med() { tr ' ' '\n' <<< "$1" | grep . | median; }
  printf "%-9s load %s s | stream pp128 %s tok/s, tg32 %s tok/s (--memory %s) | pycoder run %s tok/s\n" "$mode" \
    "$(med "${load[$mode]}")" "$(med "${pp[$mode]}")" "$(med "${tg[$mode]}")" "$BUDGET" "$(med "${run[$mode]}")"
done
echo "$out" | grep -i "bandwidth\|GB/s" | head -2 || true
