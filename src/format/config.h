#pragma once
// Hugging Face config.json -> a typed model config. Both the transformers-5 spelling
// (rope_parameters, layer_types, num_local_experts) and the older one of public checkpoints
// (rope_theta, full_attention_interval, partial_rotary_factor, num_experts) are accepted.
#include <string>
#include <vector>

namespace ms {

enum class Arch { Qwen3Moe, Qwen3Next };
enum class LayerType { FullAttention, LinearAttention };

const char* arch_name(Arch a);

struct ModelConfig {
  Arch arch = Arch::Qwen3Moe;
  std::string architecture;  // as config.json names it
  int hidden = 0;
  int n_layers = 0;
  int vocab = 0;
  float rms_eps = 1e-6f;
  bool tie_embeddings = false;
  int max_positions = 0;

  // Full attention.
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  double rope_theta = 10000.0;
  float partial_rotary = 1.0f;
  int rotary_dim() const { return int(float(head_dim) * partial_rotary) & ~1; }

  // Gated DeltaNet (Qwen3-Next linear attention).
  int conv_kernel = 0;
  int lin_k_heads = 0;
  int lin_v_heads = 0;
  int lin_k_dim = 0;
  int lin_v_dim = 0;

  // Feed-forward: MoE layers and (mlp_only_layers / decoder_sparse_step) dense ones.
  int n_experts = 0;
  int top_k = 0;
  int moe_inter = 0;
  int dense_inter = 0;
  int shared_inter = 0;  // 0 = no shared expert
  bool norm_topk = true;

  std::vector<LayerType> layer_types;
  std::vector<bool> layer_moe;

  int bos_id = -1;
  std::vector<int> eos_ids;

  bool is_moe(int layer) const { return layer_moe[size_t(layer)]; }
  bool zero_centred_norms() const { return arch == Arch::Qwen3Next; }
};

ModelConfig load_config(const std::string& path);  // a config.json file or a directory holding one

}  // namespace ms
