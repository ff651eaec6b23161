#pragma once
// The forward pass of Qwen3-MoE and Qwen3-Next, written once over a Backend B: the embedding
// (on the host), the decoder layers, the final norm, the logits and the pick; and the MTP head.
// Instantiated by each backend's executor (backends/*/).
#include <utility>
#include <vector>

#include "model/backend.h"
#include "model/blocks.h"
#include "model/executor.h"
#include "model/predict.h"
#include "model/weights.h"

namespace ms {

// Fails naming the first of ids outside the vocabulary and its position.
void check_token_ids(const ModelConfig& cfg, const int* ids, int T);
// Rows [T, hidden] of the embedding table for ids (checked first: check_token_ids).
void embed_tokens(const ModelConfig& cfg, const ModelWeights& w, const int* ids, int T, float* out);

template <Backend B>
class Forward {
 public:
  Forward(const ModelConfig& cfg, const ModelWeights& w, const B& be) : cfg_(cfg), w_(w), be_(be) {}

  // T tokens at pos0: logits, the pick, hidden states and routes as opt asks.
  ForwardResult run(const int* ids, int T, int pos0, const ForwardOptions& opt) const {
    ForwardResult r;
    std::vector<float> embedded(size_t(T) * size_t(cfg_.hidden));
    embed_tokens(cfg_, w_, ids, T, embedded.data());
    typename B::Buf x = be_.upload(std::move(embedded));
    typename B::Buf xn = be_.alloc(size_t(T) * size_t(cfg_.hidden));
    layers(x.data(), xn.data(), T, pos0, opt.routes, r, opt.verify, opt.routes_from);
    typename B::Buf logits;
    if (opt.logits) {
      const int rows = opt.all_logits ? T : 1;
      logits = be_.alloc(size_t(rows) * size_t(cfg_.vocab));
      final_logits(xn.data(), T, rows, logits.data());
      if (opt.pick) r.token = be_.pick(logits.data() + size_t(rows - 1) * size_t(cfg_.vocab), cfg_.vocab, opt.pick());
    }
    be_.finish();
    if (opt.logits && (!opt.pick || opt.all_logits)) r.logits = be_.to_host(std::move(logits));
    if (opt.hidden) {
      r.hidden_pre_norm = be_.to_host(std::move(x));
      r.hidden_post_norm = be_.to_host(std::move(xn));
    }
    return r;
  }

  // The decoder layers over x [T, hidden] in place, and xn = final_norm(x) after them; each MoE
  // layer's routes into r with `routes`; `verify` and `routes_from` as ForwardOptions has them.
  void layers(float* x, float* xn, int T, int pos0, bool routes, ForwardResult& r, bool verify = false,
              const std::vector<std::vector<int>>* routes_from = nullptr) const {
    if (routes_from) check_routes_from(*routes_from, T);
    if (routes) {
      r.routes.resize(size_t(cfg_.n_layers));
      r.router_probs.resize(size_t(cfg_.n_layers));
    }
    const auto& layers = w_.layers;
    be_.rmsnorm(x, T, cfg_.hidden, be_.vec(layers.empty() ? w_.final_norm : layers[0].input_norm), norm_offset(),
                cfg_.rms_eps, xn);
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const LayerWeights& lw = layers[size_t(l)];
      const auto [ids, probs] = routes ? route_rows(r, l, T) : std::pair<int*, float*>{};
      typename B::Linear* lin = lw.type == LayerType::LinearAttention ? &be_.linear(l) : nullptr;
      const std::vector<float>& next = l + 1 < cfg_.n_layers ? layers[size_t(l) + 1].input_norm : w_.final_norm;
      const int* forced = routes_from && lw.moe ? (*routes_from)[size_t(l)].data() : nullptr;
      decoder_layer(lw, l, T, be_.kv(l), lin, pos0, x, xn, next, ids, probs, verify, forced);
    }
  }

  // The logits of the last `rows` rows of xn [T, hidden] (final_norm(x)).
  void final_logits(const float* xn, int T, int rows, float* logits) const {
    be_.matmul(xn + size_t(T - rows) * size_t(cfg_.hidden), rows, be_.mat(w_.lm_head), logits);
  }

  // Fails unless `routes` has a row per layer and, for each MoE layer, T·top_k ids in
  // [0, n_experts), a token's distinct (each expert serves a token once).
  void check_routes_from(const std::vector<std::vector<int>>& routes, int T) const {
    const int K = cfg_.top_k;
    if (routes.size() != size_t(cfg_.n_layers))
      fail("replayed routes: {} layers for a model of {}", routes.size(), cfg_.n_layers);
    for (int l = 0; l < cfg_.n_layers; ++l) {
      if (!w_.layers[size_t(l)].moe) continue;
      const std::vector<int>& ids = routes[size_t(l)];
      if (ids.size() != size_t(T) * size_t(K))
        fail("replayed routes: layer {} has {} ids for {} tokens of top-{}", l, ids.size(), T, K);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= cfg_.n_experts)
          fail("replayed routes: layer {} routes to expert {} of {}", l, ids[i], cfg_.n_experts);
        for (size_t j = i - i % size_t(K); j < i; ++j)
          if (ids[j] == ids[i]) fail("replayed routes: layer {} routes token {} to expert {} twice", l, i / size_t(K), ids[i]);
      }
    }
  }

  // Where layer l's routes of T tokens go in r (r.routes and r.router_probs have a row per
  // layer): its ids and router probabilities, or nulls for a dense layer.
  std::pair<int*, float*> route_rows(ForwardResult& r, int l, int T) const {
    if (!w_.layers[size_t(l)].moe) return {nullptr, nullptr};
    std::vector<int>& ids = r.routes[size_t(l)];
    std::vector<float>& probs = r.router_probs[size_t(l)];
    ids.resize(size_t(T) * size_t(cfg_.top_k));
    probs.resize(size_t(T) * size_t(cfg_.n_experts));
    return {ids.data(), probs.data()};
  }

  // MTP head over T rows: row i takes hidden[i] (the main model's hidden state at position
  // pos0 + i) and the embedding of next_ids[i]; [T, vocab] logits. Uses the backend's MTP cache.
  // hidden_out, where given, gets the head's own hidden states [T, hidden] before its final norm
  // (what a second draft step takes in place of the main model's). Logits of the last
  // `logit_rows` rows only (0: none, for rows that only fill the head's cache).
  std::vector<float> mtp(const float* hidden, const int* next_ids, int T, int pos0,
                         std::vector<float>* hidden_out = nullptr, int logit_rows = -1) const {
    if (logit_rows < 0 || logit_rows > T) logit_rows = T;
    const MtpWeights& m = *w_.mtp;
    const int H = cfg_.hidden;
    const size_t n = size_t(T) * size_t(H);
    std::vector<float> embedded(n);
    embed_tokens(cfg_, w_, next_ids, T, embedded.data());
    typename B::Buf e = be_.upload(std::move(embedded)), hid = be_.upload(std::vector<float>(hidden, hidden + n));
    typename B::Buf cat = be_.alloc(2 * n), x = be_.alloc(n);
    const float offset = norm_offset();
    for (int t = 0; t < T; ++t) {  // concat(norm(embedding), norm(hidden)) per row
      float* row = cat.data() + size_t(t) * 2 * size_t(H);
      be_.rmsnorm(e.data() + size_t(t) * size_t(H), 1, H, be_.vec(m.pre_fc_norm_embedding), offset, cfg_.rms_eps, row);
      be_.rmsnorm(hid.data() + size_t(t) * size_t(H), 1, H, be_.vec(m.pre_fc_norm_hidden), offset, cfg_.rms_eps, row + H);
    }
    be_.matmul(cat.data(), T, be_.mat(m.fc), x.data());
    typename B::Buf xn = be_.alloc(n);
    be_.rmsnorm(x.data(), T, H, be_.vec(m.layer.input_norm), offset, cfg_.rms_eps, xn.data());
    decoder_layer(m.layer, -1, T, be_.mtp_kv(), nullptr, pos0, x.data(), xn.data(), m.norm, nullptr, nullptr);
    typename B::Buf logits = be_.alloc(size_t(logit_rows) * size_t(cfg_.vocab));
    if (logit_rows > 0)
      be_.matmul(xn.data() + size_t(T - logit_rows) * size_t(H), logit_rows, be_.mat(w_.lm_head), logits.data());
    if (hidden_out) *hidden_out = be_.to_host(std::move(x));
    return be_.to_host(std::move(logits));
  }

 private:
  float norm_offset() const { return cfg_.zero_centred_norms() ? 1.f : 0.f; }  // what the norms' weights add to

  // x += attention(h); x += ffn(norm(x)); h = next_norm(x). h enters as the layer's input norm of
  // x, so that each residual add and the norm after it are one add_rmsnorm. Where experts are
  // prefetched, x after the layer also predicts the experts of the layers ahead (model layer
  // `layer`; -1 for the MTP head's, which predicts none).
  void decoder_layer(const LayerWeights& lw, int layer, int T, typename B::KV& kv, typename B::Linear* lin, int pos0,
                     float* x, float* h, const std::vector<float>& next_norm, int* routes, float* router_probs,
                     bool verify = false, const int* forced_routes = nullptr) const {
    const size_t n = size_t(T) * size_t(cfg_.hidden);
    const float offset = norm_offset();
    typename B::Buf y = be_.alloc(n);
    if (lw.type == LayerType::FullAttention) attention_block(be_, cfg_, lw.attn, h, T, kv, pos0, y.data());
    else if (verify) verify_deltanet_block(be_, cfg_, lw.linear, h, T, *lin, layer, y.data());
    else deltanet_block(be_, cfg_, lw.linear, h, T, *lin, y.data());
    be_.add_rmsnorm(x, y.data(), T, cfg_.hidden, be_.vec(lw.post_attention_norm), offset, cfg_.rms_eps, h);
    ffn_block(be_, cfg_, lw.ffn, lw.moe, h, T, y.data(), routes, router_probs, forced_routes);
    be_.add_rmsnorm(x, y.data(), T, cfg_.hidden, be_.vec(next_norm), offset, cfg_.rms_eps, h);
    if (ExpertPrefetcher* store = be_.prefetch_store(); store && layer >= 0) predict_experts(be_, cfg_, w_, *store, layer, x, T);
  }

  const ModelConfig& cfg_;
  const ModelWeights& w_;
  const B& be_;
};

}  // namespace ms
