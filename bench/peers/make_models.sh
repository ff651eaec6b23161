#!/usr/bin/env bash
# The GGUF files of the side-by-side runs, and moestream's conversions of the very same files,
# into bench/peers/models (git ignored):
#   synth80b-L.gguf       Qwen3-Next-80B-A3B's layer shapes, L layers (default 16), random weights:
#                         Q4_0 experts, Q8_0 dense (../shared/peers/synth_gguf.py)
#   pycoder-Q8_0.gguf, pycoder-Q4_K_M.gguf   the trained pycoder-moe, written as bf16 by
#                         tests/data/gguf/make_gguf.py (gguf-py) and quantized by llama-quantize
# and NAME.engine/ beside each (moestream convert --from NAME.gguf).
#   bench/peers/make_models.sh [LAYERS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
layers=${1:-16}
shared=${MOESTREAM_SHARED:-$root/../shared}
ms=${MS:-$root/build/moestream}
llama_bin=$(bash "$here/build_llama.sh" cpu | tail -1)
out=$here/models
mkdir -p "$out"
gguf_py=$here/llama.cpp/gguf-py
py() { PYTHONPATH=$gguf_py /usr/bin/python3 "$@"; }

[ -f "$out/synth80b-$layers.gguf" ] ||
  py "$shared/peers/synth_gguf.py" "$out/synth80b-$layers.gguf" "$layers" "$shared/tokenizers/qwen3/tokenizer.json"
[ -f "$out/pycoder-bf16.gguf" ] ||
  py "$root/tests/data/gguf/make_gguf.py" model "$shared/models/pycoder-moe" "$out/pycoder-bf16.gguf" BF16
for t in Q8_0 Q4_K_M; do
  [ -f "$out/pycoder-$t.gguf" ] ||
    LD_LIBRARY_PATH=$llama_bin "$llama_bin/llama-quantize" "$out/pycoder-bf16.gguf" "$out/pycoder-$t.gguf" "$t" >/dev/null 2>&1
done
for g in "$out/synth80b-$layers.gguf" "$out/pycoder-Q8_0.gguf" "$out/pycoder-Q4_K_M.gguf"; do
  [ -d "${g%.gguf}.engine" ] || "$ms" convert --from "$g" --out "${g%.gguf}.engine"
done
ls -la "$out"
