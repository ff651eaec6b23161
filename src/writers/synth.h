#pragma once
// `moestream synth`: a random-weight Qwen3-Next model written directly as an engine model
// directory (docs/FORMAT.md), for streaming tests and benchmarks at a real model's shape
// without its checkpoint. Weights are a function of the seed and the tensor's name only.
#include <cstddef>
#include <cstdint>
#include <string>

namespace ms {

// The dimensions of a Qwen3-Next model (config.json's names in the comments).
struct SynthShape {
  int hidden = 0;                              // hidden_size
  int vocab = 0;                               // vocab_size
  int layers = 0;                              // num_hidden_layers
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;  // full attention, every full_attention_interval-th layer
  int full_attention_interval = 4;
  int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, conv_kernel = 4;  // Gated DeltaNet
  int n_experts = 0, top_k = 0, moe_inter = 0, shared_inter = 0;
  int dense_inter = 0;  // intermediate_size: unused (every layer is MoE), kept for the config
  int bos_id = 0, eos_id = 0;
};

// "80b-a3b": Qwen3-Next-80B-A3B's dimensions (48 layers); "tiny": a small shape for tests
// (4 layers). Throws naming the choices for anything else.
SynthShape synth_shape(const std::string& like);

struct SynthOptions {
  SynthShape shape;
  std::string out;
  int expert_bits = 4, expert_group = 64;  // as `convert`'s --expert-bits/--expert-group
  int dense_bits = 8, dense_group = 64;    // as `convert`'s --dense-bits/--dense-group
  uint64_t seed = 0;
  bool force = false;     // replace an existing output directory
  bool progress = false;  // progress bar on stderr
  bool mtp = false;       // an MTP head (mtp.*) as Qwen3-Next's: random, so its drafts are nearly never kept
};

// Bytes the directory will take (dense.safetensors and the expert blobs; the JSON files are
// small).
size_t synth_bytes(const SynthOptions& opt);

struct SynthStats {
  size_t bytes_out = 0;
  double seconds = 0;
};

// Writes the directory in bounded memory: dense tensors in pieces, experts record by record.
// Refuses an existing output without `force`, and an output the filesystem has no room for.
SynthStats synth_model(const SynthOptions& opt);

}  // namespace ms
