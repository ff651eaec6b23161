#pragma once
// Cross-layer expert prediction (../shared/DESIGN.md): the residual stream changes little from
// one layer to the next, so layer L+a's router applied to layer L's FFN input names most of the
// experts L+a will route to. While layer L computes, each target layer's top experts are handed
// to the expert store, which reads those not resident into staging in the background and
// promotes one into its pool only when routing asks for it. Prediction changes timing only:
// which experts are computed, and how, is routing's alone.
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
inline std::vector<int> predicted_experts(const std::vector<float>& logits, int T, int E, int width) {
  width = std::min(width, E);
  std::vector<int> top(size_t(T) * size_t(width)), out;
  for (int t = 0; t < T; ++t) cpu::top_k(logits.data() + size_t(t) * size_t(E), E, width, top.data() + size_t(t) * size_t(width));
  std::vector<char> seen(size_t(E), 0);
  for (int r = 0; r < width; ++r)
    for (int t = 0; t < T; ++t)
      if (const int e = top[size_t(t) * size_t(width) + size_t(r)]; !seen[size_t(e)]) {
        seen[size_t(e)] = 1;
        out.push_back(e);
      }
  return out;
}

// Predicts, from h [T, hidden] (model layer `source`'s FFN input, where B keeps activations),
// the experts of every layer the store predicts from `source`, and has the store read them ahead.
template <Backend B>
void predict_experts(const B& be, const ModelConfig& cfg, const ModelWeights& w, ExpertStore& store, int source,
                     const float* h, int T) {
  if (T > kPredictMaxTokens) return;
  const std::vector<int>& targets = store.prefetch_targets(source);
  if (targets.empty()) return;
  const int E = cfg.n_experts, width = store.prefetch_width();
  for (int target : targets) {
    const int layer = model_layer_of(store.index().layers[size_t(target)].name);
    typename B::Buf logits = be.alloc(size_t(T) * size_t(E));
    be.matmul(h, T, be.mat(w.layers[size_t(layer)].ffn.router), logits.data());
    store.prefetch(target, predicted_experts(be.to_host(std::move(logits)), T, E, width), T);
  }
}

}  // namespace ms
