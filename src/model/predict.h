#pragma once
// Cross-layer expert prediction (../shared/DESIGN.md): the residual stream changes little from
// one layer to the next, so layer L+a's router, applied to the residual stream as layer L leaves
// it (normed as L+a's FFN norms its input), names most of the experts L+a will route to. Each
// target layer's top experts are handed to the expert store, which reads those not resident
// into staging in the background while layers L+1.. compute, and promotes one into its pool
// only when routing asks for it. Prediction changes timing only: which experts are computed,
// and how, is routing's alone. (Layer L's FFN input, a half layer earlier, recovers fewer
// misses on pycoder-moe: docs/PERFORMANCE.md.)
#include <algorithm>
#include <vector>

#include "experts/expert_store.h"
#include "kernels/cpu/ops.h"
#include "model/backend.h"

namespace ms {

// Forwards of more tokens than this (prompt chunks) route nearly every expert: no prediction.
constexpr int kPredictMaxTokens = 8;

// The experts each row of logits [T, E] ranks highest, `width` a row, merged rank by rank
// (every row's best, then every row's second, ...), each expert once.
inline std::vector<int> predicted_experts(const float* logits, int T, int E, int width) {
  width = std::min(width, E);
  std::vector<int> top(size_t(T) * size_t(width)), out;
  for (int t = 0; t < T; ++t) cpu::top_k(logits + size_t(t) * size_t(E), E, width, top.data() + size_t(t) * size_t(width));
  std::vector<char> seen(size_t(E), 0);
  for (int r = 0; r < width; ++r)
    for (int t = 0; t < T; ++t)
      if (const int e = top[size_t(t) * size_t(width) + size_t(r)]; !seen[size_t(e)]) {
        seen[size_t(e)] = 1;
        out.push_back(e);
      }
  return out;
}

// A backend whose router logits come back to the host later, without a wait of their own
// (CudaBackend::to_host_later: at the forward's next routing on the host).
template <class B>
concept DefersToHost = requires(const B& be, const typename B::Buf& b) {
  be.to_host_later(b, 0, [](const float*) {});
};

// Predicts, from x [T, hidden] (the residual stream after model layer `source`, where B keeps
// activations), the experts of every layer the store predicts from `source`, and has the store
// read them ahead. Each target's router sees x as the target's own FFN norm makes it.
template <Backend B>
void predict_experts(const B& be, const ModelConfig& cfg, const ModelWeights& w, ExpertPrefetcher& store, int source,
                     const float* x, int T) {
  if (T > kPredictMaxTokens) return;
  const std::vector<int>& targets = store.prefetch_targets(source);
  if (targets.empty()) return;
  const int E = cfg.n_experts, H = cfg.hidden, width = store.prefetch_width();
  const float offset = cfg.zero_centred_norms() ? 1.f : 0.f;
  typename B::Buf h = be.alloc(size_t(T) * size_t(H));
  for (int target : targets) {
    const int layer = model_layer_of(store.index().layers[size_t(target)].name);
    const LayerWeights& lw = w.layers[size_t(layer)];
    be.rmsnorm(x, T, H, be.vec(lw.post_attention_norm), offset, cfg.rms_eps, h.data());
    typename B::Buf logits = be.alloc(size_t(T) * size_t(E));
    be.matmul(h.data(), T, be.mat(lw.ffn.router), logits.data());
    auto hand = [&store, target, T, E, width](const float* l) { store.prefetch(target, predicted_experts(l, T, E, width), T); };
    if constexpr (DefersToHost<B>) {
      be.to_host_later(logits, target, hand);
    } else {
      const std::vector<float> l = be.to_host(std::move(logits));
      hand(l.data());
    }
  }
}

}  // namespace ms
