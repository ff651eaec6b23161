#!/usr/bin/env bash
# Greedy decoding of pycoder-moe's three reference prompts by moestream and by llama.cpp on the
# very same GGUF file. llama.cpp's text is tokenized back with the model's tokenizer; where the
# two first differ, moestream's top-2 logit margin there says whether it is a near-tie.
#   greedy_agreement.sh FILE.gguf [TOKENS]
# Needs build/moestream, llama.cpp built by bench/peers/build_llama.sh (LLAMA_BIN overrides),
# ../shared/models/pycoder-moe/reference.safetensors.
set -uo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
gguf=$1
tokens=${2:-48}
ms=${MS:-$here/build/moestream}
llama_bin=${LLAMA_BIN:-$here/bench/peers/llama.cpp/build/bin}
shared=${MOESTREAM_SHARED:-$here/../shared}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
engine=$work/engine
"$ms" convert --from "$gguf" --out "$engine" >/dev/null || exit 1
py=/usr/bin/python3
agree=0
for j in 0 1 2; do
  ids=$($py "$here/bench/peers/tensor_ids.py" "$shared/models/pycoder-moe/reference.safetensors" "prompt$j.input_ids")
  echo "[$ids]" | "$ms" detokenize --model "$engine" >"$work/prompt.txt"
  ours=$("$ms" generate --model "$engine" --ids "$ids" --max-tokens "$tokens" --ignore-eos | tr -d '[] \n')
  prompt=$(cat "$work/prompt.txt"; echo x)  # -p keeps a final newline, which -f would drop
  LD_LIBRARY_PATH=$llama_bin "$llama_bin/llama-completion" -m "$gguf" -p "${prompt%x}" -n "$tokens" --temp 0 \
    --ignore-eos -no-cnv --no-display-prompt --no-warmup -c 512 -t "$(nproc)" --simple-io \
    >"$work/llama.txt" 2>"$work/llama.err" </dev/null
  head -c -2 "$work/llama.txt" >"$work/llama.gen"  # llama-completion ends its output with "\n\n"
  theirs=$("$ms" tokenize --model "$engine" <"$work/llama.gen" | tr -d '[] \n')
  same=$($py -c 'import sys
a, b = sys.argv[1].split(","), sys.argv[2].split(",")
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
print(n)' "$ours" "$theirs")
  if [ "$same" -ge "$tokens" ]; then
    echo "prompt$j: identical, $tokens tokens"
    agree=$((agree + 1))
    continue
  fi
  prefix=$ids; [ "$same" -gt 0 ] && prefix="$ids,$(echo "$ours" | cut -d, -f1-"$same")"
  "$ms" logits --model "$engine" --ids "$prefix" --out "$work/l.safetensors" >/dev/null
  margin=$($py "$here/bench/peers/tensor_ids.py" "$work/l.safetensors" logits --margin)
  echo "prompt$j: the first $same tokens agree; at token $((same + 1)) moestream's top-2 logit margin is $margin"
  echo "  moestream: $(echo "[$(echo "$ours" | cut -d, -f$((same + 1))-$((same + 8)))]" | "$ms" detokenize --model "$engine" | tr '\n' '~')"
  echo "  llama.cpp: $(echo "[$(echo "$theirs" | cut -d, -f$((same + 1))-$((same + 8)))]" | "$ms" detokenize --model "$engine" | tr '\n' '~')"
done
echo "$(basename "$gguf"): $agree of 3 prompts decode to the same $tokens tokens"
