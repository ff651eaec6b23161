#pragma once
// CPU kernels of the model's glue between the matmuls (the CUDA backend's are in
// kernels/cuda/model_ops.cu, tested against these): the preparation of attention and DeltaNet
// inputs from their projections, output gates, and the grouping of the MoE's routed experts.
#include <cstddef>
#include <vector>

#include "kernels/deltanet_prep.h"
#include "kernels/weights.h"
#include "quant/kv_quant.h"

namespace ms::cpu {

// q and the cache's k and v of an attention layer from its projections q_raw [T, q_width], k, v
// [T, nkv*hd]: the split of a gated q_raw (per head hd query values then hd gate values into q
// and gate), the per-head norms, RoPE at positions pos0.., and k_out, v_out [T, nkv*hd] (the
// cache's rows at pos0) in turn.
struct AttentionPrepareArgs {
  const float *q_raw, *k, *v, *q_norm, *k_norm;
  float *q, *gate, *k_out, *v_out;
  double theta;
  float offset, eps;
  int T, nh, nkv, hd, rot_dim, pos0;
  bool gated;
};
void attention_prepare(const AttentionPrepareArgs& a);

// n rows of hd values (keys or values of one position and head each) into a KV cache's rows of
// `side` at out: each rotated by rot first where given, then kv_encode'd.
void kv_store(const float* rows, size_t n, int hd, KvSide side, const KvRotator* rot, uint8_t* out);

// out[i] *= sigmoid(gate[i]): a gated attention's output.
void sigmoid_gate(float* out, const float* gate, size_t n);

// The gated delta rule's inputs (kernels/deltanet_prep.h) from the projections qkvz and ba:
// their split (the checkpoints group by key head), the causal conv over q, k and v (conv_state
// updated), the L2 norms of q and k per head, q scaled, and the gates g = A *
// softplus(a + dt_bias), beta = sigmoid(b).
void deltanet_prepare(const DeltaNetPrep& a);

// out[t] += sigmoid(gate · x[t]) * s[t]: the shared expert's gated contribution.
void shared_gate_add(float* out, const float* s, const float* x, const Mat& gate, int T, int H);

// The routed experts' users (token * K + slot, per expert) and their routing weights [T * K].
struct ExpertUsers {
  const std::vector<std::vector<int>>& users;
  const std::vector<float>& weights;
  int K;
};
// xb[j] = x[token of user j of expert e], rows of H.
void gather_users(const ExpertUsers& g, int e, const float* x, int H, float* xb);
// partial[user j of expert e] = its weight * yb[j], rows of H.
void scatter_users(const ExpertUsers& g, int e, const float* yb, int H, float* partial);
// out[t] = sum over k in order of partial[t, k], rows of H.
void sum_slots(const float* partial, int T, int K, int H, float* out);

}  // namespace ms::cpu
