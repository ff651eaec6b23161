#!/usr/bin/env bash
# Builds llama.cpp from the source archive in ../shared/peers into bench/peers/llama.cpp (git
# ignored): llama-completion, llama-bench and llama-quantize. `cuda` adds the CUDA backend (on
# the GPU machine); the default is this machine's CPU build. Does nothing when already built.
#   bench/peers/build_llama.sh [cpu|cuda]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
kind=${1:-cpu}
shared=${MOESTREAM_SHARED:-$here/../../../shared}
src=$here/llama.cpp
bin=$src/build-$kind/bin
if [ -x "$bin/llama-completion" ] && [ -x "$bin/llama-quantize" ]; then echo "$bin"; exit 0; fi
archive=$(ls "$shared"/peers/llama.cpp-*.tar.xz | head -1)
if [ ! -f "$src/CMakeLists.txt" ]; then
  mkdir -p "$src"
  tar -xJf "$archive" -C "$src"
fi
flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF)
[ "$kind" = cuda ] && flags+=(-DGGML_CUDA=ON)
cmake -S "$src" -B "$src/build-$kind" -G Ninja "${flags[@]}" >"$src/cmake-$kind.log"
cmake --build "$src/build-$kind" -j"$(nproc)" --target llama-completion llama-bench llama-quantize >"$src/build-$kind.log"
echo "$bin"
