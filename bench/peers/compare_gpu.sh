#!/usr/bin/env bash
# moestream and llama.cpp decoding the very same GGUF file on the GPU (moestream: its conversion,
# NAME.engine). `all`: every weight in VRAM (llama.cpp -ngl 99). A VRAM budget of X GiB: moestream
# --vram XG with every expert cached in host RAM (--host-cache), against llama.cpp -ngl 99
# --n-cpu-moe N, N the fewest layers whose experts, left to its CPU kernels, fit the rest in X GiB
# (cpu_moe_layers.py, from the file's tensor sizes). Both warm: each runs once untimed, then the
# timed run. Prints one table: case, budget, tok/s of each, the ratio, N, llama.cpp's VRAM (its
# model, KV, state and compute buffers) and moestream's VRAM pool hit rate. Needs a CUDA llama.cpp
# (build_llama.sh cuda) and gguf-py.
#   bench/peers/compare_gpu.sh MODEL.gguf [BUDGETS...]     BUDGETS: all or GiB (default: all 8 4)
# TOKENS (default 128), TEMP (default 0: greedy), THREADS (nproc), HOST_CACHE (default 64G),
# PYTHON (with numpy), LLAMA_BIN (default: bench/peers/llama.cpp/build-cuda/bin), GGUF_PY
# (default: bench/peers/llama.cpp/gguf-py), LOG (default /tmp/peers-gpu).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
gguf=$1
shift
budgets=${*:-all 8 4}
engine=${gguf%.gguf}.engine
tokens=${TOKENS:-128}
threads=${THREADS:-$(nproc)}
ms=${MS:-$root/build/moestream}
llama_bin=${LLAMA_BIN:-$here/llama.cpp/build-cuda/bin}
gguf_py=${GGUF_PY:-$here/llama.cpp/gguf-py}
log=${LOG:-/tmp/peers-gpu}
mkdir -p "$log"
prompt="def fibonacci(n):"
ids=$("$ms" tokenize --model "$engine" <<<"$prompt" | tr -d '[] \n')
# TEMP > 0: both sample (seed 1), so that the tokens, and with them the routed experts, vary from
# step to step; greedy decoding of a random-weight model repeats one token, whose experts then
# always hit a VRAM pool.
temp=${TEMP:-0}
ms_cmd=(generate --ids "$ids")
[ "$temp" != 0 ] && ms_cmd=(run --prompt "$prompt" --temperature "$temp" --seed 1)

# generate --stats: "decode S s (R tok/s)"; run --stats: "decode R tok/s".
# moestream's VRAM pool hit rate over the run (the total of --stats' pool table).
ms_hit() { awk '/VRAM expert pool/ {f = 1} f && $1 == "total" {print $5; exit}' "$1"; }
ms_tps() { sed -n -e 's/.*decode [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' -e 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' "$1" | head -1; }
llama_tps() { grep ' eval time' "$1" | grep -v 'prompt eval' | sed -n 's/.*, *\([0-9.]*\) tokens per second.*/\1/p'; }
# llama.cpp's CUDA buffers (model, KV, recurrent state, compute) in GiB, from its log (-lv 4); the
# last of each kind, as it sizes the compute buffers once in a trial before the load.
llama_vram() {
  sed -n 's/.*CUDA0 *\(model\|KV\|RS\|compute\) buffer size = *\([0-9.]*\) MiB.*/\1 \2/p' "$1" |
    awk '{v[$1] = $2} END {for (k in v) s += v[k]; if (s > 0) printf "%.2f", s / 1024; else print "-"}'
}

printf '%-26s %-6s %12s %12s %7s %6s %11s %7s\n' case vram moestream llama.cpp ratio n-cpu 'llama VRAM' 'ms hit'
for b in $budgets; do
  mem=() llama=(-ngl 99) n=0
  if [ "$b" != all ]; then
    n=$(PYTHONPATH=$gguf_py ${PYTHON:-python3} "$here/cpu_moe_layers.py" "$gguf" "$b") || continue
    mem=(--vram "${b}G" --host-cache "${HOST_CACHE:-64G}")
    llama+=(--n-cpu-moe "$n")
  fi
  f=$log/ms-$(basename "$engine")-$b.log
  for run in warm timed; do
    "$ms" "${ms_cmd[@]}" --device cuda --model "$engine" --max-tokens "$tokens" --ignore-eos --stats \
      "${mem[@]}" >/dev/null 2>"$f"
  done
  g=$log/llama-$(basename "$gguf")-$b.log
  for run in warm timed; do
    env LD_LIBRARY_PATH="$llama_bin" "$llama_bin/llama-completion" -m "$gguf" -p "$prompt" -n "$tokens" \
      -t "$threads" "${llama[@]}" --ignore-eos -no-cnv -c 1024 --temp "$temp" --seed 1 -lv 4 >/dev/null 2>"$g" </dev/null
  done
  a=$(ms_tps "$f") c=$(llama_tps "$g")
  ratio=$(awk -v a="${a:-0}" -v c="${c:-0}" 'BEGIN { if (a > 0 && c > 0) printf "%.2f", a / c; else print "-" }')
  printf '%-26s %-6s %12s %12s %7s %6s %11s %7s\n' "$(basename "$gguf")" "$b" "${a:--}" "${c:--}" "$ratio" "$n" \
    "$(llama_vram "$g")" "$(ms_hit "$f")"
done
