#pragma once
// The weights of a Qwen3-MoE / Qwen3-Next model as the forward pass reads them. Matrices are
// borrowed from the mmap'ed checkpoint or engine directory (no copy); norms and small vectors
// are float32 copies.
// One struct for both families: what a family lacks stays empty (calm's "flags in one config").
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "format/config.h"
#include "experts/expert_store.h"
#include "format/engine_dir.h"
#include "format/safetensors.h"
#include "kernels/weights.h"

namespace ms {

struct MlpWeights {  // SwiGLU: down(silu(gate x) * up x)
  Mat gate, up, down;
};

// One MLP of a batch a backend may run together (a layer's experts): y [n, hidden] = mlp(x [n, hidden]).
struct MlpCall {
  MlpWeights w;
  const float* x;
  int n;
  float* y;
};

struct AttentionWeights {
  Mat q_proj, k_proj, v_proj, o_proj;  // Qwen3-Next: q_proj yields query and gate per head
  std::vector<float> q_norm, k_norm;   // per-head RMSNorm over head_dim
};

struct DeltaNetWeights {  // Gated DeltaNet (Qwen3-Next linear attention)
  Mat in_proj_qkvz, in_proj_ba, out_proj;
  std::vector<float> conv1d;  // [conv_dim, kernel]
  // [linear_num_value_heads]: A = −exp(A_log), the decay scale (computed once at load, or stored
  // as such by a GGUF import: llama.cpp keeps A, not A_log), and dt_bias.
  std::vector<float> A, dt_bias;
  std::vector<float> norm;            // [linear_value_head_dim], gated RMSNorm
};

struct FfnWeights {
  Mat router;                        // MoE: [n_experts, hidden]
  std::vector<MlpWeights> experts;   // MoE: routed experts, when all are in memory ...
  int store_layer = -1;              // ... or their layer in the model's ExpertStore
  const ExpertLayer* record_layout = nullptr;  // (streamed) where the projections lie in a record
  MlpWeights shared_expert;          // Qwen3-Next: always-on expert ...
  Mat shared_expert_gate;            // ... scaled by sigmoid(shared_expert_gate · x)
  MlpWeights dense;                  // dense (non-MoE) layers
};

struct LayerWeights {
  LayerType type = LayerType::FullAttention;
  bool moe = true;
  std::vector<float> input_norm, post_attention_norm;
  AttentionWeights attn;
  DeltaNetWeights linear;
  FfnWeights ffn;
};

struct MtpWeights {  // Qwen3-Next multi-token-prediction head (keys mtp.*)
  Mat fc;  // [hidden, 2*hidden]: concat(norm(embedding), norm(hidden)) -> hidden
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  LayerWeights layer;  // one full-attention decoder layer with its own MoE
};

struct ModelWeights {
  Mat embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
  Mat lm_head;  // [vocab, hidden]; the embedding when tied
  std::unique_ptr<MtpWeights> mtp;  // null when the checkpoint has no mtp.* tensors

  // Bytes of matrices, split by what streams (routed experts) and what stays resident.
  size_t dense_bytes = 0, expert_bytes = 0;
  size_t mtp_bytes = 0;  // of dense_bytes, the MTP head's (decode without speculation reads none)
  size_t dense_params = 0, expert_params = 0;

  std::deque<std::vector<float>> owned;  // float32 copies of f16 matrices
};

// From a Hugging Face checkpoint (experts == null: routed experts are checkpoint tensors) or an
// engine directory: dense tensors from `store` (a quantized matrix NAME is NAME.q /
// NAME.scales / NAME.biases), routed experts streamed through `experts`.
ModelWeights load_weights(const ModelConfig& cfg, const TensorStore& store, const ExpertStore* experts = nullptr);

// The gate/up/down matrices of one expert record laid out as `layer` says.
MlpWeights expert_weights(const ExpertLayer& layer, const uint8_t* record);

}  // namespace ms
