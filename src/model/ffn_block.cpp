#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/blocks.h"

namespace ms {

void mlp_forward(const MlpWeights& w, const float* x, int T, float* out) {
  const size_t n = size_t(T) * size_t(w.gate.rows);
  std::vector<float> g(n), u(n);
  cpu::matmul(x, T, w.gate, g.data());
  cpu::matmul(x, T, w.up, u.data());
  cpu::silu_mul(g.data(), u.data(), g.data(), int64_t(n));
  cpu::matmul(g.data(), T, w.down, out);
}

namespace {

struct Routing {
  std::vector<int> ids;         // [T, top_k], largest probability first
  std::vector<float> weights;   // [T, top_k]
};

Routing route(const ModelConfig& cfg, const Mat& router, const float* x, int T, float* probs_out) {
  const int E = cfg.n_experts, K = cfg.top_k;
  std::vector<float> probs(size_t(T) * size_t(E));
  cpu::matmul(x, T, router, probs.data());
  cpu::softmax(probs.data(), T, E);
  Routing r{std::vector<int>(size_t(T) * size_t(K)), std::vector<float>(size_t(T) * size_t(K))};
  for (int t = 0; t < T; ++t) {
    const float* p = probs.data() + size_t(t) * size_t(E);
    int* ids = r.ids.data() + size_t(t) * size_t(K);
    float* wt = r.weights.data() + size_t(t) * size_t(K);
    cpu::top_k(p, E, K, ids);
    float sum = 0.f;
    for (int k = 0; k < K; ++k) sum += (wt[k] = p[ids[k]]);
    if (cfg.norm_topk)
      for (int k = 0; k < K; ++k) wt[k] /= sum;
  }
  if (probs_out) std::copy(probs.begin(), probs.end(), probs_out);
  return r;
}

// Runs each routed expert once over the tokens that chose it. Per-(token, slot) results are
// summed in top-k order afterwards, so the answer depends neither on the order experts run in
// nor on how they are split into waves.
void routed_experts(const ModelConfig& cfg, const FfnWeights& w, const Routing& r, const float* x, int T, float* out,
                    ExpertStore* store) {
  const int H = cfg.hidden, K = cfg.top_k;
  std::vector<std::vector<int>> users(size_t(cfg.n_experts));  // (token * K + slot) per expert
  std::vector<int> order;                                       // distinct experts, first use first
  for (int i = 0; i < T * K; ++i) {
    auto& u = users[size_t(r.ids[size_t(i)])];
    if (u.empty()) order.push_back(r.ids[size_t(i)]);
    u.push_back(i);
  }

  std::vector<float> partial(size_t(T) * size_t(K) * size_t(H));
  std::vector<float> xb, yb;
  auto run = [&](int e, const MlpWeights& mlp) {
    const auto& u = users[size_t(e)];
    const int n = int(u.size());
    xb.resize(size_t(n) * size_t(H));
    yb.resize(size_t(n) * size_t(H));
    for (int j = 0; j < n; ++j) std::copy_n(x + size_t(u[size_t(j)] / K) * size_t(H), H, xb.data() + size_t(j) * size_t(H));
    mlp_forward(mlp, xb.data(), n, yb.data());
    for (int j = 0; j < n; ++j) {
      const float wt = r.weights[size_t(u[size_t(j)])];
      float* dst = partial.data() + size_t(u[size_t(j)]) * size_t(H);
      for (int h = 0; h < H; ++h) dst[h] = wt * yb[size_t(j) * size_t(H) + size_t(h)];
    }
  };
  if (w.store_layer < 0) {
    for (int e : order) run(e, w.experts[size_t(e)]);
  } else {
    const size_t cap = size_t(store->capacity(w.store_layer));
    for (size_t b = 0; b < order.size(); b += cap) {
      const std::vector<int> wave(order.begin() + std::ptrdiff_t(b), order.begin() + std::ptrdiff_t(std::min(order.size(), b + cap)));
      std::vector<const uint8_t*> records = store->acquire(w.store_layer, wave);
      for (size_t j = 0; j < wave.size(); ++j) run(wave[j], expert_weights(*w.record_layout, records[j]));
      store->release(w.store_layer);
    }
  }
  for (int t = 0; t < T; ++t) {
    float* o = out + size_t(t) * size_t(H);
    std::fill(o, o + H, 0.f);
    for (int k = 0; k < K; ++k) {
      const float* p = partial.data() + (size_t(t) * size_t(K) + size_t(k)) * size_t(H);
      for (int h = 0; h < H; ++h) o[h] += p[h];
    }
  }
}

void add_shared_expert(const ModelConfig& cfg, const FfnWeights& w, const float* x, int T, float* out) {
  const int H = cfg.hidden;
  std::vector<float> s(size_t(T) * size_t(H)), g(static_cast<size_t>(T));
  mlp_forward(w.shared_expert, x, T, s.data());
  cpu::matmul(x, T, w.shared_expert_gate, g.data());
  for (int t = 0; t < T; ++t) {
    const float gate = 1.0f / (1.0f + std::exp(-g[size_t(t)]));
    for (int h = 0; h < H; ++h) out[size_t(t) * size_t(H) + size_t(h)] += gate * s[size_t(t) * size_t(H) + size_t(h)];
  }
}

}  // namespace

void ffn_block(const ModelConfig& cfg, const FfnWeights& w, bool moe, const float* x, int T, float* out, int* routes,
               ExpertStore* store, float* router_probs) {
  if (!moe) {
    mlp_forward(w.dense, x, T, out);
    return;
  }
  Routing r = route(cfg, w.router, x, T, router_probs);
  if (routes) std::copy(r.ids.begin(), r.ids.end(), routes);
  routed_experts(cfg, w, r, x, T, out, store);
  if (cfg.shared_inter > 0) add_shared_expert(cfg, w, x, T, out);
}

}  // namespace ms
