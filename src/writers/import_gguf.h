#pragma once
// `convert --from FILE.gguf`: a llama.cpp GGUF file of a Qwen3-Next (`qwen3next`) or Qwen3-MoE
// (`qwen3moe`) model -> an engine model directory, without changing any dequantized weight:
// block types become affine matrices (quant/gguf_blocks.h), llama.cpp's renames and reorders
// are undone, and config.json, tokenizer.json and the chat template are rebuilt from the file's
// metadata (docs/FORMAT.md, "Importing GGUF files").
#include <string>

#include "writers/convert.h"

namespace ms {

// A regular file that starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

ConvertStats convert_gguf(const ConvertOptions& opt);

}  // namespace ms
