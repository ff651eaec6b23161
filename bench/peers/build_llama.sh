#!/usr/bin/env bash
# Builds llama.cpp from the source archive in ../shared/peers into bench/peers/llama.cpp (git
# ignored): llama-completion, llama-bench and llama-quantize. The default is this machine's CPU
# build. `cuda` builds here (nvcc, no GPU needed; about 75 minutes on 2 cores) for the GPU machine:
# sm_${CUDA_ARCH:-90} only, without the FlashAttention kernels (LLAMA_FA=ON adds them), the CPU
# part for AVX-512 with VNNI (the H100 machine's Xeon), linked against the driver stub; carry
# bin/llama-bench and its lib*.so.0 there (libnccl.so.2 is in PyTorch's site-packages there).
# Does nothing when already built.
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
if [ "$kind" = cuda ]; then
  stub=$src/build-cuda/stub  # libcuda.so.1 comes with the driver; link against the toolkit's stub
  mkdir -p "$stub"
  ln -sf "$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib/stubs/libcuda.so" "$stub/libcuda.so.1"
  flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_CUDA_FA="${LLAMA_FA:-OFF}"
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
    -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$stub")
fi
cmake -S "$src" -B "$src/build-$kind" -G Ninja "${flags[@]}" >"$src/cmake-$kind.log"
cmake --build "$src/build-$kind" -j"$(nproc)" --target llama-completion llama-bench llama-quantize >"$src/build-$kind.log"
echo "$bin"
