#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) into ./build-fuzz with clang-14 and runs them.
#   scripts/fuzz.sh [SECONDS [TARGET...]]  fuzzes each target SECONDS (default 30), then replays
#                                          fuzz/regressions/ (every crash ever found; must pass)
#   scripts/fuzz.sh --replay [DIR]         only replays DIR/<target>/* (default fuzz/regressions;
#                                          fuzz/findings holds the crashes not fixed yet)
#   scripts/fuzz.sh --promote              git-moves each finding that now passes to fuzz/regressions
# A target's new inputs go to build-fuzz/corpus/<target>, its crashes to build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each input may take 10 s and 2 GB; longer or larger is a finding (a hang, an unbounded allocation).
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048)
targets_all=(format_config format_safetensors format_engine_dir format_gguf tokenizer_tokenizer chat_jinja
             chat_tool_calls chat_chat_template chat_chat_template_config)

# The dictionary of the tokens a target's input is made of.
dict_of() {
  case "$1" in
    format_config) echo fuzz/dict/config.dict ;;
    format_safetensors) echo fuzz/dict/safetensors.dict ;;
    format_engine_dir) echo fuzz/dict/engine_dir.dict ;;
    format_gguf) echo fuzz/dict/gguf.dict ;;
    tokenizer_tokenizer) echo fuzz/dict/tokenizer.dict ;;
    chat_jinja) echo fuzz/dict/jinja.dict ;;
    chat_tool_calls) echo fuzz/dict/tool_calls.dict ;;
    chat_chat_template*) echo fuzz/dict/chat_template.dict ;;
  esac
}

build() {
  if ! command -v clang++-14 >/dev/null 2>&1; then
    echo "fuzz: clang++-14 is missing; scripts/setup.sh installs it (clang-14, libclang-rt-14-dev)" >&2
    return 1
  fi
  local launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B build-fuzz -G Ninja -DMOESTREAM_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug -DBUILD_TESTING=OFF \
        -DCMAKE_CXX_COMPILER=clang++-14 "${launcher[@]}" >/dev/null
  cmake --build build-fuzz -j"$(nproc)"
}

# Runs one target for $2 seconds from its committed seeds; prints where a crash was kept.
fuzz_one() {
  local t=$1 seconds=$2 log=build-fuzz/logs/$1.log
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/artifacts/$t" build-fuzz/logs
  echo "fuzz: $t for ${seconds}s"
  if ! "build-fuzz/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=65536 "${limits[@]}" -dict="$(dict_of "$t")" \
       -artifact_prefix="build-fuzz/artifacts/$t/" -print_final_stats=1 -print_funcs=0 \
       "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $t FAILED; the input is in build-fuzz/artifacts/$t/, the log in $log" >&2
    return 1
  fi
  grep -E '^stat::number_of_executed_units|^#[0-9]+[[:space:]]+DONE' "$log" | tr '\n' ' '
  echo
}

# Runs every input kept under $1/<target>/, one process each so that every failing one is named;
# each must pass.
replay() {
  local dir=$1 failed=0 t f n bad
  for t in "${targets_all[@]}"; do
    [ -d "$dir/$t" ] || continue
    n=0 bad=0
    while IFS= read -r f; do
      n=$((n + 1))
      if ! "build-fuzz/fuzz/fuzz_$t" "${limits[@]}" "$f" >"build-fuzz/logs/replay.log" 2>&1; then
        grep -E 'accepted invalid|SUMMARY|what\(\)|runtime error' build-fuzz/logs/replay.log | head -n 3
        echo "fuzz: replay FAILED: $f (build-fuzz/fuzz/fuzz_$t $f)" >&2
        bad=$((bad + 1))
      fi
    done < <(find "$dir/$t" -type f ! -name '*.md' | sort)
    ((n == 0)) || echo "fuzz: replay $dir/$t: $((n - bad)) of $n inputs pass"
    ((bad == 0)) || failed=1
  done
  return "$failed"
}

# Moves every input of fuzz/findings/<target>/ that passes now to fuzz/regressions/<target>/.
promote() {
  local t f
  for t in "${targets_all[@]}"; do
    [ -d "fuzz/findings/$t" ] || continue
    while IFS= read -r f; do
      if "build-fuzz/fuzz/fuzz_$t" "${limits[@]}" "$f" >build-fuzz/logs/replay.log 2>&1; then
        mkdir -p "fuzz/regressions/$t"
        git mv "$f" "fuzz/regressions/$t/"
        echo "fuzz: fixed, now a regression case: fuzz/regressions/$t/$(basename "$f")"
      fi
    done < <(find "fuzz/findings/$t" -type f | sort)
  done
}

main() {
  build
  mkdir -p build-fuzz/logs
  # The targets' scratch files (fuzz/fuzz_support.h), in tmpfs where there is one; a target that
  # crashed leaves its own behind, so all go at the end.
  local shm=/dev/shm
  [ -d "$shm" ] && [ -w "$shm" ] || shm=${TMPDIR:-/tmp}
  TMPDIR=$(mktemp -d "$shm/moestream-fuzz.XXXXXX")
  export TMPDIR
  trap 'rm -rf "$TMPDIR"' EXIT
  if [ "${1:-}" = "--promote" ]; then
    promote
    return
  fi
  if [ "${1:-}" = "--replay" ]; then
    replay "${2:-fuzz/regressions}"
    return
  fi
  local seconds=${1:-30} failed=0 t
  shift || true
  local targets=("$@")
  ((${#targets[@]})) || targets=("${targets_all[@]}")
  for t in "${targets[@]}"; do fuzz_one "$t" "$seconds" || failed=1; done
  replay fuzz/regressions || failed=1
  return "$failed"
}

main "$@"
