#!/usr/bin/env bash
# Predictive streaming on the CPU (not a test): the 16-layer Qwen3-Next-80B-A3B-shaped synth under
# cgroup v1 memory caps with --memory equal to the cap, prefetch off and on, llama.cpp beside it
# on the same shape, page cache dropped before every run; next to the machine's limits measured
# in the same run: the disk's O_DIRECT random-read rate at the record size (fio) and a
# compute-only run (every expert pinned resident, its load not timed). Medians of REPEAT runs.
#
#   sudo MODEL=<engine dir> GGUF=<synth.gguf> LLAMA=<llama-completion> bench/prefetch_bench.sh
#
# Make the models with `moestream synth --like 80b-a3b --layers 16 --expert-bits 4 --dense-bits 8`
# and ../shared/peers/synth_gguf.py. Environment: MOESTREAM (default build/moestream), CAPS (GiB,
# "12 8 4"), TOKENS (128), SLOW_TOKENS (llama.cpp's tokens at 4 GiB and below, 8), REPEAT (3),
# LOG (where each run's output is kept, /tmp/prefetch-bench), BASE (an earlier moestream binary
# to run beside, without --prefetch). Needs a quiet machine and root.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MOESTREAM:-$ROOT/build/moestream}
CAPS=${CAPS:-12 8 4}
TOKENS=${TOKENS:-128}
SLOW_TOKENS=${SLOW_TOKENS:-8}
REPEAT=${REPEAT:-3}
LOG=${LOG:-/tmp/prefetch-bench}
IDS=1000,2000,3000,4000,5000,6000,7000,8000,9000,10000,11000,12000,13000,14000,15000,16000
CG_ROOT=/sys/fs/cgroup/memory
: "${MODEL:?MODEL=<engine dir of the 16-layer synth>}"
[[ $(id -u) == 0 ]] || { echo "needs root (cgroups, drop_caches)" >&2; exit 1; }
mkdir -p "$LOG"
log() { printf '%s\n' "$*" >&2; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
json() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))$2)" "$1"; }

STRIDE=$(json "$MODEL/moestream.json" "['expert_layers'][0]['stride']")
LAYERS=$(json "$MODEL/moestream.json" "['expert_layers'].__len__()")
EXPERTS=$(json "$MODEL/config.json" "['num_experts']")
TOPK=$(json "$MODEL/config.json" "['num_experts_per_tok']")

# ---- the disk: O_DIRECT random reads of one record each (the best queue depth) ----
command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio; } >&2
FIO=0
files=$(ls "$MODEL"/experts/*.bin | paste -sd:)
for qd in 1 4 16; do
  bw=$(fio --name=r --filename="$files" --rw=randread --bs="$STRIDE" --direct=1 --ioengine=io_uring --iodepth=$qd \
         --runtime=8 --time_based --group_reporting --output-format=json 2>/dev/null |
       python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['read']['bw_bytes'] / 1e9)")
  log "fio QD$qd: $bw GB/s"
  FIO=$(awk -v a="$FIO" -v b="$bw" 'BEGIN {print (b > a ? b : a)}')
done

in_cap() {  # GiB|none logfile cmd...: runs cmd in a fresh cgroup of that limit; appends the peak
  local cap=$1 out=$2; shift 2
  sync; echo 3 > /proc/sys/vm/drop_caches
  if [[ $cap == none ]]; then "$@" > /dev/null 2> "$out" < /dev/null; return; fi
  local g=$CG_ROOT/prefetch-bench-$$-$RANDOM rc=0
  mkdir "$g"
  echo $((cap * 1073741824)) > "$g/memory.limit_in_bytes"
  ( echo $BASHPID > "$g/cgroup.procs"; exec "$@" ) > /dev/null 2> "$out" < /dev/null || rc=$?
  echo "cgroup_peak_bytes $(cat "$g/memory.max_usage_in_bytes")" >> "$out"
  rmdir "$g"
  return $rc
}

# Fields of one moestream run's --stats: tok/s, hit rate, stall s, total s, recall, waste, GB/s,
# misses, tokens decoded, peak cgroup GiB.
ms_fields() {
  local f=$1
  local tps hit stall total recall waste gbs misses peak
  tps=$(sed -n 's/.*decode [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$f" | head -1)
  read -r misses hit stall <<<"$(awk '$1 == "total" && NF == 8 {print $3, $5, $8; exit}' "$f")"
  total=$(sed -n 's/.*| total \([0-9.]*\) s$/\1/p' "$f" | head -1)
  recall=$(sed -n 's/^prefetch: .* recall \([0-9.]*\),.*/\1/p' "$f")
  waste=$(sed -n 's/^prefetch: .* waste \([0-9.]*\),.*/\1/p' "$f")
  gbs=$(awk '$1 == "disk_load_ratio" {print $4}' "$f")
  peak=$(awk '$1 == "cgroup_peak_bytes" {printf "%.2f", $2 / 1073741824}' "$f")
  echo "${tps:--} ${hit:--} ${stall:-0} ${total:-0} ${recall:--} ${waste:--} ${gbs:--} ${misses:-0} ${peak:--}"
}

# ---- compute only: every expert pinned but top_k per layer, so decode reads (almost) nothing ----
profile=$LOG/pin-all.json
python3 - "$LAYERS" "$EXPERTS" "$TOPK" > "$profile" <<'PY'
import json, sys
layers, experts, top_k = map(int, sys.argv[1:])
print(json.dumps({"layer_caps": {str(l): experts for l in range(layers)},
                  "pins": {str(l): list(range(experts - top_k)) for l in range(layers)}}))
PY
COMPUTE=()
for r in $(seq "$REPEAT"); do
  in_cap none "$LOG/compute-$r.log" "$BIN" generate --model "$MODEL" --ids "$IDS" --max-tokens "$TOKENS" --ignore-eos \
    --stats --pool-profile "$profile" --prefetch off || true
  COMPUTE+=("$(ms_fields "$LOG/compute-$r.log" | cut -d' ' -f1)")
done
COMPUTE_TPS=$(printf '%s\n' "${COMPUTE[@]}" | median)
log "compute only: ${COMPUTE[*]} tok/s"

ROWS=()
for cap in $CAPS; do
  for pf in ${BASE:+base} off on; do
    runs=()
    for r in $(seq "$REPEAT"); do
      f=$LOG/ms-$cap-$pf-$r.log
      if [[ $pf == base ]]; then cmd=("$BASE" generate); else cmd=("$BIN" generate --prefetch "$pf"); fi
      in_cap "$cap" "$f" "${cmd[@]}" --model "$MODEL" --ids "$IDS" --max-tokens "$TOKENS" --ignore-eos --stats \
        --memory "${cap}G" || log "moestream cap $cap prefetch $pf run $r failed: $(tail -1 "$f")"
      runs+=("$(ms_fields "$f")")
    done
    med() { printf '%s\n' "${runs[@]}" | awk -v c="$1" '{print $c}' | median; }
    tps=$(med 1)
    # The bound: max(the pool's misses at the disk's fio rate, compute only), per token.
    misses=$(med 8)
    bound=$(awk -v m="$misses" -v s="$STRIDE" -v f="$FIO" -v n="$TOKENS" -v c="$COMPUTE_TPS" \
      'BEGIN {r = (f > 0 ? m * s / (f * 1e9) / n : 0); k = (c > 0 ? 1 / c : 0); printf "%.4f", (r > k ? r : k)}')
    ratio=$(awk -v t="$tps" -v b="$bound" 'BEGIN {printf "%.2f", (t > 0 && b > 0 ? (1 / t) / b : 0)}')
    share=$(printf '%s\n' "${runs[@]}" | awk '{print ($4 > 0 ? $3 / $4 : 0)}' | median)
    ROWS+=("$(printf '%-4s %-9s %8s %6s %8.3f %7s %7s %7s %8s %7s %s' "${cap}G" "ms-pf-$pf" "$tps" "$(med 2)" "$share" \
      "$(med 5)" "$(med 6)" "$(med 7)" "$bound" "$ratio" "$(med 9)")")
    log "cap ${cap}G prefetch $pf: $(printf '%s | ' "${runs[@]}")"
  done
  if [[ -n ${LLAMA:-} && -n ${GGUF:-} ]]; then
    n=$TOKENS; (( cap <= 4 )) && n=$SLOW_TOKENS
    lruns=()
    for r in $(seq "$REPEAT"); do
      f=$LOG/llama-$cap-$r.log
      in_cap "$cap" "$f" "$LLAMA" -m "$GGUF" -p "def fibonacci(n): return" -n "$n" -t "$(nproc)" --no-repack --ignore-eos \
        -no-cnv -c 512 --temp 0 || true
      lruns+=("$(grep ' eval time' "$f" | grep -v 'prompt eval' | sed -n 's/.*, *\([0-9.]*\) tokens per second.*/\1/p')")
    done
    ltps=$(printf '%s\n' "${lruns[@]}" | median)
    ROWS+=("$(printf '%-4s %-9s %8s %6s %8s %7s %7s %7s %8s %7s %s' "${cap}G" "llama.cpp" "$ltps" - - - - - - - \
      "$(awk '$1 == "cgroup_peak_bytes" {printf "%.2f", $2 / 1073741824}' "$LOG/llama-$cap-1.log") n=$n")")
    log "cap ${cap}G llama.cpp: ${lruns[*]} tok/s"
  fi
done

echo "moestream predictive streaming: $MODEL ($LAYERS layers, $EXPERTS experts top-$TOPK, $STRIDE-byte records)"
echo "disk: fio O_DIRECT random $STRIDE-byte reads, best of QD 1/4/16: $FIO GB/s; compute only (every expert resident):" \
     "$COMPUTE_TPS tok/s; load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; medians of $REPEAT"
echo "stall_sh: compute waiting on reads over prefill+decode; bound: max(misses x record / fio rate, compute-only) s/token;"
echo "x_bound: time per token over the bound (goal <= 1.25); peak: cgroup peak GiB (page cache included)"
printf '%-4s %-9s %8s %6s %8s %7s %7s %7s %8s %7s %s\n' cap engine "tok/s" hit stall_sh recall waste "GB/s" bound x_bound peak
printf '%s\n' "${ROWS[@]}"
