#!/usr/bin/env bash
# GPU streaming benchmark (not a test), for a machine with an NVIDIA GPU: decode tok/s and the
# stall share with the VRAM expert pool capped, the host tier off (staging only) and on, for
#  - a synthetic Qwen3-Next-80B-A3B-shaped model (random weights, 4-bit experts, 8-bit dense),
#    LAYERS layers, at --vram 4G, 8G, 16G;
#  - the same model's decode workloads (bench: uniform, text, a replayed trace calibrated to real
#    models' routing, and greedy as an upper bound) at each budget with the host tier on;
#  - the embedded pycoder-moe-q4 with every expert in VRAM and with 8 and 16 VRAM slots a layer;
# next to the machine's own limits measured in the same run: the device-to-device copy
# bandwidth (bench_cuda_matvec), and the disk's O_DIRECT read rate at the record size (dd).
#
#   bench/cuda_streaming_bench.sh
#
# Environment: MOESTREAM (binary, default build/moestream), MATVEC (bench_cuda_matvec binary,
# default build/bench/bench_cuda_matvec), BENCH_DIR (where the model is written, default
# /var/tmp/moestream-bench), LAYERS (16), TOKENS (decode tokens, 64), HOST_CACHE (the host tier
# when on, 32G), VRAMS (the 80B cases' budgets, "4G 8G 16G"), PREFETCH (the --prefetch modes of
# the 80B cases, "off on"), PYCODER_CASES (0 leaves pycoder out), KEEP=1 keeps the model.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MOESTREAM:-$ROOT/build/moestream}
MATVEC=${MATVEC:-$ROOT/build/bench/bench_cuda_matvec}
WORK=${BENCH_DIR:-/var/tmp/moestream-bench}
LAYERS=${LAYERS:-16}
TOKENS=${TOKENS:-64}
HOST_CACHE=${HOST_CACHE:-32G}
VRAMS=${VRAMS:-4G 8G 16G}
PREFETCH=${PREFETCH:-off on}
IDS=1000,2000,3000,4000,5000,6000,7000,8000,9000,10000,11000,12000,13000,14000,15000,16000
PY_IDS=500,1000,1500,2000,2500,3000,3500,4000,4500,5000,5500,6000,6500,7000,7500,8000  # pycoder: 8192 ids
PYCODER=$ROOT/models/pycoder-moe-q4

[[ -x $BIN ]] || { echo "no moestream binary at $BIN" >&2; exit 1; }
mkdir -p "$WORK"
MODEL=$WORK/qwen3-next-80b-a3b-synth
trap '[[ ${KEEP:-0} == 1 ]] || rm -rf "$MODEL" "$MODEL".tmp-*' EXIT
log() { printf '%s\n' "$*" >&2; }

if [[ ! -f $MODEL/moestream.json ]]; then
  log "== synth: 80b-a3b shape, $LAYERS layers, 4-bit experts, 8-bit dense"
  t0=$(date +%s.%N)
  "$BIN" synth --like 80b-a3b --layers "$LAYERS" --expert-bits 4 --out "$MODEL" --force >&2
  log "synth took $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s; $(du -sh "$MODEL" | cut -f1) on disk"
fi
STRIDE=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['expert_layers'][0]['stride'])" "$MODEL/moestream.json")

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

# ---- the machine's limits ----
drop_caches
DISK=$(dd if="$MODEL/experts/layer_001.bin" of=/dev/null bs="$STRIDE" count=256 iflag=direct 2>&1 |
       awk '/copied/ {print $(NF-1), $NF}')
HBM=""
[[ -x $MATVEC ]] && HBM=$("$MATVEC" 2>/dev/null | grep -i -m1 "copy" || true)

# ---- decode runs ----
RESULTS=()
run_case() {  # name model ids args...
  local name=$1 model=$2 ids=$3
  shift 3
  local err=$WORK/run-$name.log rc=0
  drop_caches
  "$BIN" generate --device cuda --model "$model" --ids "$ids" --max-tokens "$TOKENS" --ignore-eos --stats "$@" \
    > /dev/null 2> "$err" || rc=$?
  local decode total vhit stall hhit stages
  decode=$(sed -n 's/.*decode [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$err")
  total=$(sed -n 's/.*| total \([0-9.]*\) s$/\1/p' "$err")
  # The first "total" row is the VRAM pool's, the second the host tier's.
  read -r vhit stall <<<"$(awk '$1 == "total" && NF == 8 {print $5, $8; exit}' "$err")"
  hhit=$(awk '$1 == "total" && NF == 8 {n++; if (n == 2) print $5}' "$err")
  stages=$(sed -n 's/^stages: ssd->host \([0-9.]*\) GB\/s.*host->vram \([0-9.]*\) GB\/s.*/\1 \2/p' "$err")
  local share
  share=$(awk -v s="${stall:-0}" -v t="${total:-0}" 'BEGIN {printf "%.3f", (t > 0 ? s / t : 0)}')
  local recall
  recall=$(sed -n 's/^prefetch: .* recall \([0-9.]*\),.*/\1/p' "$err")
  RESULTS+=("$(printf '%-28s %4d %9s %7s %7s %8s %8s %8s %7s' "$name" "$rc" "${decode:--}" "${vhit:--}" "${hhit:--}" \
    "$share" ${stages:-- -} "${recall:--}")")
  log "== $name (exit $rc)"
  cat "$err" >&2
}
for vram in $VRAMS; do
  for pf in $PREFETCH; do
    run_case "80b-vram$vram-pf$pf" "$MODEL" "$IDS" --vram "$vram" --prefetch "$pf"
    run_case "80b-vram$vram-host$HOST_CACHE-pf$pf" "$MODEL" "$IDS" --vram "$vram" --host-cache "$HOST_CACHE" --prefetch "$pf"
  done
done
# Workload rows (bench): uniform (sampled), text (teacher-forced) and replay (a trace calibrated
# to real models' routing, synth-routes) at each budget with the host tier on; greedy labelled
# as the upper bound it is on random weights (one expert set repeats).
TRACE=$WORK/routes-80b-$LAYERS.safetensors
[[ -f $TRACE ]] || "$BIN" synth-routes --like 80b-a3b --layers "$LAYERS" --tokens 4096 --out "$TRACE" >&2
WORKLOADS=()
for vram in $VRAMS; do
  drop_caches
  while read -r row; do WORKLOADS+=("$(printf '%-10s %s' "$vram" "$row")"); done < <(
    "$BIN" bench --device cuda --model "$MODEL" --vram "$vram" --host-cache "$HOST_CACHE" --prompt 0 \
      --tokens "$TOKENS" --repeat 3 --workload uniform,text,replay,greedy --text "$ROOT/docs/ARCHITECTURE.md" \
      --routes-from "$TRACE" 2> "$WORK/bench-$vram.log" | grep -E '^tg' | sed 's/-greedy /-greedy(upper bound) /')
done
if [[ ${PYCODER_CASES:-1} == 1 ]]; then
  run_case "pycoder-all-in-vram" "$PYCODER" "$PY_IDS"
  for slots in 8 16; do
    run_case "pycoder-slots$slots" "$PYCODER" "$PY_IDS" --expert-slots "$slots"
    run_case "pycoder-slots$slots-host" "$PYCODER" "$PY_IDS" --expert-slots "$slots" --host-cache 1G
  done
fi

echo
echo "moestream GPU streaming benchmark: Qwen3-Next-80B-A3B shape, $LAYERS layers, random weights, 4-bit experts ($STRIDE-byte records); pycoder-moe-q4"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
echo "disk: O_DIRECT sequential reads of $STRIDE-byte records (dd): ${DISK:-?}"
echo "HBM: ${HBM:-bench_cuda_matvec not found}"
echo "decode/s: decode tok/s over $TOKENS tokens after a 16-token prompt; vram_hit, host_hit: hit rates;"
echo "stall_sh: time waiting on expert reads+copies over prefill+decode; ssd_GBs, h2d_GBs: achieved stage rates;"
echo "recall: host-tier misses avoided by prefetch (pf on)"
printf '%-28s %4s %9s %7s %7s %8s %8s %8s %7s\n' case exit "decode/s" vram_hit host_hit stall_sh ssd_GBs h2d_GBs recall
printf '%s\n' "${RESULTS[@]}"
echo
echo "workloads (bench --host-cache $HOST_CACHE, medians of 3): vram, test, tok/s, GB/s, of read; replay routes by $TRACE"
printf '%s\n' "${WORKLOADS[@]}"
