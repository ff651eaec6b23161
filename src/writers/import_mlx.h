#pragma once
// `convert --from MLX_DIR`: an mlx-lm quantized checkpoint -> an engine model directory,
// losslessly: the engine's affine format is mlx's arithmetic, so codes, scales and biases are
// copied byte for byte (docs/FORMAT.md, "Importing MLX checkpoints").
#include <string>

#include "writers/convert.h"

namespace ms {

// A directory whose config.json has mlx-lm's `quantization`, or whose tensors use mlx-lm's
// stacked expert names (`.switch_mlp.`).
bool is_mlx_checkpoint(const std::string& dir);

ConvertStats convert_mlx(const ConvertOptions& opt);

}  // namespace ms
