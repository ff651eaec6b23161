#pragma once
// The pieces of `convert` that the importers of other checkpoint layouts (MLX, GGUF) share:
// planning and writing routed experts from Hugging Face tensors, dense tensors, the side files.
#include <array>
#include <chrono>
#include <string>
#include <vector>

#include "format/config.h"
#include "format/engine_dir.h"
#include "format/safetensors.h"
#include "util/progress.h"
#include "writers/convert.h"
#include "writers/engine_writer.h"

namespace ms {

// One MoE block of a Hugging Face checkpoint: its record layout and, per expert, the gate, up
// and down tensors it is made from.
struct ExpertPlan {
  ExpertLayer layout;
  std::vector<std::array<const TensorView*, 3>> sources;
};

// The block's experts (`block` = "model.layers.3.mlp"; `layer_key` = "3" or "mtp" for
// --layer-bits), quantized as opt asks.
ExpertPlan plan_expert_block(const ModelConfig& cfg, const TensorStore& store, const ConvertOptions& opt,
                             const std::string& block, const std::string& layer_key);

// Writes the block's blob into dir (the temporary output directory).
void write_experts(const std::filesystem::path& dir, ExpertPlan& plan, Progress& progress);

// One source tensor of dense.safetensors: copied as stored (bits 16) or quantized into
// NAME.q / NAME.scales / NAME.biases.
struct DenseItem {
  const TensorView* src;
  int bits = kRawBits, group = 0;
  size_t first_spec = 0;  // its (first) output tensor in the writer's declaration order
};

// Declares `t` (dense rules of opt) in specs and returns the item that writes it.
DenseItem plan_dense_tensor(const TensorView& t, const ConvertOptions& opt, std::vector<TensorSpec>* specs);
void write_dense_item(SafetensorsWriter& w, const DenseItem& item, Progress& progress);

// Drops the pages of a consumed source tensor (the sources are mmap'ed).
void release(const TensorView& t);

// Copies config.json, tokenizer.json, tokenizer_config.json, generation_config.json and
// chat_template.jinja from `from` into dir where present (config.json is required).
void copy_side_files(const std::filesystem::path& from, const std::filesystem::path& dir);

// Bytes of the regular files under dir.
size_t directory_bytes(const std::filesystem::path& dir);

// The end of every conversion: writes the index last (a directory holding moestream.json holds
// everything it names), renames the temporary directory to opt.out, and fills stats' output
// bytes and seconds since `start`.
ConvertStats commit_conversion(TempDir& tmp, const EngineIndex& index, const ModelConfig& cfg, const ConvertOptions& opt,
                               ConvertStats stats, std::chrono::steady_clock::time_point start);

}  // namespace ms
