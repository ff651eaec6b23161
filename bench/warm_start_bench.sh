#!/usr/bin/env bash
# Warm start on the CPU (not a test). For pycoder-moe-q4 at 16 slots a layer, and (with SYNTH) the
# 16-layer 80B synth under --memory 8G in an 8 GiB cgroup: one run over a prompt leaves a usage
# history; then, page cache dropped before each, runs over another prompt cold (--warm-start off)
# and warm (auto, pin) report the first tokens' hit rate, the load's reads, the time to the 32nd
# token and the decode rate over 256 tokens. With SYNTH, also the synth with no budget: load, time
# to the first token and decode rate, loaded whole against filled by misses. Medians of REPEAT.
#
#   sudo [SYNTH=<engine dir>] bench/warm_start_bench.sh
#
# Environment: MOESTREAM (default build/moestream), REPEAT (3), LOG (/tmp/warm-start-bench).
# Needs a quiet machine and root (drop_caches, cgroups).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MOESTREAM:-$ROOT/build/moestream}
REPEAT=${REPEAT:-3}
LOG=${LOG:-/tmp/warm-start-bench}
CG_ROOT=/sys/fs/cgroup/memory
[[ $(id -u) == 0 ]] || { echo "needs root (cgroups, drop_caches)" >&2; exit 1; }
mkdir -p "$LOG"
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }

run() {  # cap-GiB|none logfile args...: drops the page cache, runs moestream (in a cgroup of that limit)
  local cap=$1 out=$2; shift 2
  sync; echo 3 > /proc/sys/vm/drop_caches
  if [[ $cap == none ]]; then "$BIN" "$@" > /dev/null 2> "$out"; return; fi
  local g=$CG_ROOT/warm-bench-$$-$RANDOM rc=0
  mkdir "$g"
  echo $((cap * 1073741824)) > "$g/memory.limit_in_bytes"
  ( echo $BASHPID > "$g/cgroup.procs"; exec "$BIN" "$@" ) > /dev/null 2> "$out" || rc=$?
  rmdir "$g"
  return $rc
}
field() { grep -oP "$2" "$1" | head -1; }  # the first match of a Perl regex in a log

case_runs() {  # name cap model-args...: the history run, then cold / auto / pin on another prompt
  local name=$1 cap=$2; shift 2
  local usage=$LOG/$name.usage.json ids_a=1000,2000,3000,4000 ids_b=5000,600,70,8000,900
  rm -f "$usage"
  run "$cap" "$LOG/$name.history.log" generate "$@" --usage "$usage" --ids "$ids_a" --max-tokens 128 --ignore-eos
  printf '%-26s %8s %8s %10s %10s %10s\n' "$name" "hit@64" "load s" "32nd tok s" "tg256" "stall s"
  for mode in off auto pin; do
    local hits=() loads=() t32=() tg=() stall=()
    for r in $(seq "$REPEAT"); do
      local l=$LOG/$name.$mode.$r
      run "$cap" "$l.32" generate "$@" --usage "$usage" --warm-start "$mode" --ids "$ids_b" --max-tokens 32 --ignore-eos --stats
      hits+=("$(field "$l.32" 'first \d+ tokens: hit rate \K[0-9.]+')")
      loads+=("$(field "$l.32" 'in \K[0-9.]+(?= s;)' || echo 0)")
      t32+=("$(field "$l.32" 'total \K[0-9.]+')")
      run "$cap" "$l.256" generate "$@" --usage "$usage" --warm-start "$mode" --ids "$ids_b" --max-tokens 256 --ignore-eos --stats
      tg+=("$(field "$l.256" 'decode [0-9.]+ s \(\K[0-9.]+')")
      stall+=("$(grep -P '^ +total ' "$l.256" | awk '{print $NF}')")
    done
    printf '%-26s %8s %8s %10s %10s %10s\n' "  warm start $mode" "$(printf '%s\n' "${hits[@]}" | median)" \
      "$(printf '%s\n' "${loads[@]}" | median)" "$(printf '%s\n' "${t32[@]}" | median)" \
      "$(printf '%s\n' "${tg[@]}" | median)" "$(printf '%s\n' "${stall[@]}" | median)"
  done
}

case_runs pycoder-16-slots none --model "$ROOT/models/pycoder-moe-q4" --expert-slots 16
if [[ -n ${SYNTH:-} ]]; then
  case_runs synth-8G 8 --model "$SYNTH" --memory 8G
  printf '%-26s %10s %14s %10s\n' "synth, no budget" "load s" "first token s" "tg64"
  for whole in yes no; do
    loads=() ttft=() tg=()
    extra=(); [[ $whole == no ]] && extra=(--no-load-whole)
    for r in $(seq "$REPEAT"); do
      l=$LOG/synth-whole-$whole.$r
      t0=$(date +%s.%N)
      run none "$l.1" generate --model "$SYNTH" "${extra[@]}" --usage off --ids 1000,2000 --max-tokens 1 --stats
      ttft+=("$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')")
      loads+=("$(field "$l.1" 'every expert read \(\K[0-9.]+' || echo 0)")
      run none "$l.64" generate --model "$SYNTH" "${extra[@]}" --usage off --ids 1000,2000 --max-tokens 64 --ignore-eos --stats
      tg+=("$(field "$l.64" 'decode [0-9.]+ s \(\K[0-9.]+')")
    done
    printf '%-26s %10s %14s %10s\n' "  loaded whole: $whole" "$(printf '%s\n' "${loads[@]}" | median)" \
      "$(printf '%s\n' "${ttft[@]}" | median)" "$(printf '%s\n' "${tg[@]}" | median)"
  done
fi
