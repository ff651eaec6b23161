#!/usr/bin/env bash
# moestream and llama.cpp decoding the very same GGUF file (moestream: its conversion, NAME.engine)
# side by side under cgroup v1 memory caps, the page cache dropped before every run, with the same
# thread count. Prints one table: case, tok/s of each, the ratio, the peak RSS of each. Needs root
# (caps, drop_caches); run bench/peers/make_models.sh first. A benchmark, not a test.
#   bench/peers/compare.sh MODEL.gguf [CAPS...]        CAPS: GiB or none (default: none 12 8 4)
# TOKENS (default 32), SLOW_TOKENS (llama.cpp at 4 GiB and below, default 8), THREADS (nproc),
# LLAMA_BIN (default: bench/peers/llama.cpp/build-cpu/bin), LOG (default /tmp/peers).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
gguf=$1
shift
caps=${*:-none 12 8 4}
engine=${gguf%.gguf}.engine
tokens=${TOKENS:-32}
threads=${THREADS:-$(nproc)}
ms=${MS:-$root/build/moestream}
llama_bin=${LLAMA_BIN:-$here/llama.cpp/build-cpu/bin}
log=${LOG:-/tmp/peers}
mkdir -p "$log"
prompt="def fibonacci(n):"
ids=$("$ms" tokenize --model "$engine" <<<"$prompt" | tr -d '[] \n')
cg=/sys/fs/cgroup/memory

# runs "$@" in a fresh memory cgroup of `cap` GiB (none: no cgroup) from a cold page cache;
# /usr/bin/time writes the peak RSS (KiB) to $1.rss
in_cap() {
  local cap=$1 out=$2
  shift 2
  sync
  echo 3 >/proc/sys/vm/drop_caches
  if [ "$cap" = none ]; then
    /usr/bin/time -f %M -o "$out.rss" "$@"
    return
  fi
  local g=$cg/peers-$$-$RANDOM
  mkdir "$g"
  echo $((cap * 1073741824)) >"$g/memory.limit_in_bytes"
  (echo $BASHPID >"$g/cgroup.procs" && exec /usr/bin/time -f %M -o "$out.rss" "$@")
  local rc=$?
  rmdir "$g" 2>/dev/null
  return $rc
}

gib() { awk '{printf "%.2f", $1 / 1048576}' "$1" 2>/dev/null || echo -; }

printf '%-26s %-5s %12s %12s %7s %10s %10s\n' case cap moestream llama.cpp ratio 'ms RSS' 'llama RSS'
for cap in $caps; do
  mem=()
  [ "$cap" = none ] || mem=(--memory "${cap}G")
  f=$log/ms-$(basename "$engine")-$cap
  in_cap "$cap" "$f" "$ms" generate --model "$engine" --ids "$ids" --max-tokens "$tokens" --ignore-eos --stats \
    "${mem[@]}" >/dev/null 2>"$f.log"
  a=$(sed -n 's/.*decode [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$f.log" | head -1)
  n=$tokens
  [ "$cap" != none ] && [ "$cap" -le 4 ] && n=${SLOW_TOKENS:-8}
  g=$log/llama-$(basename "$gguf")-$cap
  in_cap "$cap" "$g" env LD_LIBRARY_PATH="$llama_bin" "$llama_bin/llama-completion" -m "$gguf" -p "$prompt" -n "$n" \
    -t "$threads" --no-repack --ignore-eos -no-cnv --no-warmup -c 512 --temp 0 >/dev/null 2>"$g.log" </dev/null
  b=$(grep ' eval time' "$g.log" | grep -v 'prompt eval' | sed -n 's/.*, *\([0-9.]*\) tokens per second.*/\1/p')
  ratio=$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "-" }')
  printf '%-26s %-5s %12s %12s %7s %10s %10s\n' "$(basename "$gguf")" "$cap" "${a:--}" "${b:--}" "$ratio" \
    "$(gib "$f.rss")" "$(gib "$g.rss")"
done
