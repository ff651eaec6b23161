#pragma once
// What the forward (model/forward.h) asks of a device: the block-level operations of a decoder
// layer, written once in the blocks (model/*_block.h) over any B that models Backend. Each
// backend fuses inside its own operations (the CUDA backend's mlp is one launch for a decode
// token's gate and up; its moe routes on the GPU); the CPU backend (backends/cpu) is the
// reference the CUDA one (backends/cuda) is tested against.
//
// Pointers are activations where B keeps them (B::Buf's data: host memory on the CPU, device
// memory on the GPU); Mat and MlpWeights are as the kernels take them (B::mat, B::mlp_weights
// map the model's host weights to them); T is the tokens of the batch, at positions pos0...
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <vector>

#include "experts/expert_store.h"
#include "format/config.h"
#include "kernels/sampling.h"
#include "model/weights.h"

namespace ms {

template <class B>
concept Backend = requires(const B& be, const Mat& m, const MlpWeights& mlp, const FfnWeights& ffn,
                           const ModelConfig& cfg, const std::vector<float>& v, std::vector<float> host,
                           typename B::Buf buf, typename B::KV& kv, const float* x, float* y, int n, bool flag,
                           double theta, const PickInputs& pick) {
  // Activations: allocated, from and to host memory.
  { be.alloc(size_t{}) } -> std::same_as<typename B::Buf>;
  { be.upload(std::move(host)) } -> std::same_as<typename B::Buf>;
  { be.to_host(std::move(buf)) } -> std::same_as<std::vector<float>>;
  { buf.data() } -> std::same_as<float*>;
  // The model's weights as the kernels take them, and the sequence's caches.
  { be.mat(m) } -> std::convertible_to<const Mat&>;
  { be.mlp_weights(mlp) } -> std::convertible_to<MlpWeights>;
  { be.vec(v) } -> std::same_as<const float*>;
  { be.kv(n) } -> std::same_as<typename B::KV&>;
  { be.mtp_kv() } -> std::same_as<typename B::KV&>;
  { be.linear(n) } -> std::same_as<typename B::Linear&>;
  // y = x · Wᵀ; and for several W of one x, part after part in y.
  be.matmul(x, n, m, y);
  be.matmul_stack(x, n, std::initializer_list<const Mat*>{&m}, y);
  // Norms: out = rmsnorm(x); x += y then out = rmsnorm(x).
  be.rmsnorm(x, n, n, x, 0.f, 0.f, y);
  be.add_rmsnorm(y, x, n, n, x, 0.f, 0.f, y);
  // Full attention: q (and a gated layer's gate) and the cache's rows at pos0 from the
  // projections; then the attention of q over the cache, gated where gate is given.
  be.attention_prepare(x, x, x, n, n, n, n, flag, x, x, 0.f, 0.f, n, n, theta, y, y, kv);
  be.attention(x, kv, n, n, n, n, n, x, y);
  // Gated DeltaNet: the rule's inputs from the projections, the rule, the gated norm.
  be.deltanet_prepare(x, x, n, n, n, n, n, x, n, y, x, x, 0.f, 0.f, y, y, y, y, y, y);
  be.gated_delta_rule(x, x, x, x, x, n, n, n, n, n, y, y);
  be.rmsnorm_gated(x, x, x, n, n, 0.f, y);
  // Feed-forward: a SwiGLU MLP; a MoE layer (router, routed experts, shared expert), its routed
  // ids and router probabilities to host memory where given, its routes forced where given
  // (ForwardOptions::routes_from).
  be.mlp(mlp, x, n, y);
  be.moe(cfg, ffn, x, n, y, static_cast<int*>(nullptr), static_cast<float*>(nullptr), static_cast<const int*>(nullptr));
  // The expert store that reads predicted experts ahead (model/predict.h), else null.
  { be.prefetch_store() } -> std::same_as<ExpertPrefetcher*>;
  // The next token from logits [vocab] where they are; all queued work done.
  { be.pick(x, n, pick) } -> std::same_as<int>;
  be.finish();
};

}  // namespace ms
