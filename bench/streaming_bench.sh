#!/usr/bin/env bash
# Streaming benchmark (not a test): a synthetic Qwen3-Next-80B-A3B-shaped model (random
# weights, 4-bit experts) decoded with --memory 4G and 8G, each inside a cgroup v1 memory cap
# of the same size and without one, the page cache dropped before every run; the disk's
# O_DIRECT random-read bandwidth at the expert record size (fio) for comparison; and
# `moestream simulate` over the pycoder-moe routing traces for every policy at 8, 16, 32 slots.
#
#   sudo bench/streaming_bench.sh            # needs root: cgroups, drop_caches, apt-get fio
#
# Environment: MOESTREAM (binary, default build/moestream), BENCH_DIR (where the model is
# written, default /var/tmp/moestream-bench), LAYERS (16), TOKENS (decode tokens, 96),
# ROUTES (traces), KEEP=1 keeps the model afterwards.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MOESTREAM:-$ROOT/build/moestream}
WORK=${BENCH_DIR:-/var/tmp/moestream-bench}
LAYERS=${LAYERS:-16}
TOKENS=${TOKENS:-96}
ROUTES=${ROUTES:-$ROOT/../shared/models/pycoder-moe/routes.safetensors}
IDS=1000,2000,3000,4000,5000,6000,7000,8000,9000,10000,11000,12000,13000,14000,15000,16000
CG_ROOT=/sys/fs/cgroup/memory

[[ -x $BIN ]] || { echo "no moestream binary at $BIN (build it: ninja -C build moestream)" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (cgroups, drop_caches)" >&2; exit 1; }
mkdir -p "$WORK"
MODEL=$WORK/qwen3-next-80b-a3b-synth
trap '[[ ${KEEP:-0} == 1 ]] || rm -rf "$MODEL" "$MODEL".tmp-*' EXIT

log() { printf '%s\n' "$*" >&2; }

# ---- disk space: ~0.91 GB of 4-bit experts per layer plus ~1.3 GB of 8-bit dense weights ----
avail=$(df --output=avail -B1 "$WORK" | tail -1)
per_layer=910000000
fits=$(( (avail - 1400000000 - 2000000000) / per_layer ))  # keep 2 GB spare
if (( fits < LAYERS )); then
  (( fits >= 1 )) || { log "not enough disk at $WORK: $((avail / 1000000000)) GB free"; exit 1; }
  log "NOTE: $((avail / 1000000000)) GB free at $WORK: $fits layers instead of $LAYERS"
  LAYERS=$fits
fi

log "== synth: 80b-a3b shape, $LAYERS layers, 4-bit experts, 8-bit dense"
t0=$(date +%s.%N)
"$BIN" synth --like 80b-a3b --layers "$LAYERS" --expert-bits 4 --out "$MODEL" --force >&2
log "synth took $(echo "$(date +%s.%N) - $t0" | bc) s; $(du -sh "$MODEL" | cut -f1) on disk"
STRIDE=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['expert_layers'][0]['stride'])" "$MODEL/moestream.json")

# ---- the disk: O_DIRECT random reads of one expert record each ----
if ! command -v fio >/dev/null; then
  log "installing fio"
  (apt-get update -qq && apt-get install -y -qq fio) >&2 || log "fio could not be installed"
fi
declare -A DISK
DISK_BEST=0  # the best of the queue depths: the engine's read rate is reported against it
if command -v fio >/dev/null; then
  files=$(ls "$MODEL"/experts/*.bin | paste -sd:)
  for qd in 1 10 32; do
    bw=$(fio --name=expert-read --filename="$files" --rw=randread --bs="$STRIDE" --direct=1 --ioengine=io_uring \
           --iodepth=$qd --runtime=10 --time_based --group_reporting --output-format=json 2>/dev/null |
         python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['read']['bw_bytes'] / 1e9)")
    DISK[$qd]=$bw
    DISK_BEST=$(awk -v a="$DISK_BEST" -v b="$bw" 'BEGIN {print (b > a ? b : a)}')
    log "fio: $STRIDE-byte O_DIRECT random reads, io_uring, queue depth $qd: $(printf %.2f "$bw") GB/s"
  done
fi

# ---- decode runs ----
RESULTS=()
run_case() {  # name memory cap(0/1)
  local name=$1 mem=$2 cap=$3 err=$WORK/run-$1.log cg="" peak=""  # mem in whole GiB: "4G"
  sync
  echo 3 > /proc/sys/vm/drop_caches
  local cmd="exec $BIN generate --model $MODEL --ids $IDS --max-tokens $TOKENS --ignore-eos --memory $mem --stats"
  if (( cap )); then
    cg=$CG_ROOT/moestream-bench-$$-$name
    mkdir "$cg"
    echo $(( ${mem%G} * 1073741824 )) > "$cg/memory.limit_in_bytes"
    cmd="echo \$\$ > $cg/cgroup.procs; $cmd"
  fi
  local rc=0
  /usr/bin/time -f "maxrss_kb %M wall_s %e" sh -c "$cmd" > /dev/null 2> "$err" || rc=$?
  if [[ -n $cg ]]; then
    peak=$(( $(cat "$cg/memory.max_usage_in_bytes") / 1048576 ))
    rmdir "$cg"
  fi
  local decode hit ratio gbps stall total rss
  decode=$(sed -n 's/.*decode [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$err")
  total=$(sed -n 's/.*| total \([0-9.]*\) s$/\1/p' "$err")
  read -r hit stall <<<"$(awk '$1 == "total" && NF == 8 {print $5, $8}' "$err")"
  read -r ratio gbps <<<"$(awk '$1 == "disk_load_ratio" {print $2, $4}' "$err")"
  rss=$(( $(awk '/maxrss_kb/ {print $2}' "$err") / 1024 ))
  local share frac
  share=$(awk -v s="$stall" -v t="$total" 'BEGIN {printf "%.3f", (t > 0 ? s / t : 0)}')
  frac=$(awk -v g="$gbps" -v d="$DISK_BEST" 'BEGIN {printf "%.2f", (d > 0 ? g / d : 0)}')
  RESULTS+=("$(printf '%-12s %4s %5s %4d %9s %6s %8s %8s %6s %8s %8s %6s' "$name" "$mem" "$([[ $cap == 1 ]] && echo yes || echo no)" \
    "$rc" "$decode" "$hit" "$ratio" "$gbps" "$frac" "$share" "$rss" "${peak:--}")")
  log "$name: exit $rc"
  cat "$err" >&2
}
log "== decode: $TOKENS tokens after a 16-token prompt (load average $(cut -d' ' -f1-3 /proc/loadavg))"
run_case cap-4G 4G 1
run_case cap-8G 8G 1
run_case nocap-4G 4G 0
run_case nocap-8G 8G 0

# ---- routing traces through the pool: hit rate against Belady's ----
SIM=()
if [[ -f $ROUTES ]]; then
  for slots in 8 16 32; do
    for policy in lru lfu lrfu; do
      line=$("$BIN" simulate --routes "$ROUTES" --slots $slots --policy $policy | awk '$1 == "total"')
      SIM+=("$(printf '%5d %6s %s' $slots $policy "$line")")
    done
  done
fi

echo
echo "moestream streaming benchmark: Qwen3-Next-80B-A3B shape, $LAYERS layers, random weights, 4-bit experts ($STRIDE-byte records)"
[[ -n ${DISK[10]:-} ]] && printf 'disk O_DIRECT random %s-byte reads (fio, io_uring): QD1 %.2f GB/s, QD10 %.2f GB/s, QD32 %.2f GB/s\n' \
  "$STRIDE" "${DISK[1]}" "${DISK[10]}" "${DISK[32]}"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
echo "decode/s: decode tok/s; hit: pool hit rate; disk_ld: disk_load_ratio; read/GBs: the engine's read rate;"
echo "of_disk: that over fio's best; stall_sh: expert-read stall over prefill+decode time; rss: peak RSS; cg: cgroup peak"
printf '%-12s %4s %5s %4s %9s %6s %8s %8s %6s %8s %8s %6s\n' case mem cgroup exit "decode/s" hit disk_ld "read/GBs" "of_disk" stall_sh "rss_MiB" "cg_MiB"
printf '%s\n' "${RESULTS[@]}"
if (( ${#SIM[@]} )); then
  echo
  echo "simulate: $ROUTES"
  printf '%5s %6s %6s %8s %8s %8s %10s\n' slots policy "" policy lru belady "of_belady"
  printf '%s\n' "${SIM[@]}"
fi
