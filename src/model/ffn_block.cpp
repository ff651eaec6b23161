#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/backend_cpu.h"
#include "model/backend_cuda.h"
#include "model/blocks.h"

namespace ms {

template <class B>
void mlp_forward(const B& be, const MlpWeights& w, const float* x, int T, float* h, float* u, float* out) {
  if (!be.fused_gate_up(x, T, w.gate, w.up, h)) {
    be.matmul(x, T, w.gate, h);
    be.matmul(x, T, w.up, u);
    be.silu_mul(h, u, h, int64_t(T) * w.gate.rows);
  }
  be.matmul(h, T, w.down, out);
}

template <class B>
void mlp_forward(const B& be, const MlpWeights& w, const float* x, int T, float* out) {
  const size_t n = size_t(T) * size_t(w.gate.rows);
  typename B::Buf h = be.alloc(n), u = be.alloc(n);
  mlp_forward(be, w, x, T, h.data(), u.data(), out);
}

namespace {

struct Routing {
  std::vector<int> ids;         // [T, top_k], largest probability first
  std::vector<float> weights;   // [T, top_k]
};

// The router's probabilities come to the host: grouping tokens by expert needs the routed ids
// there anyway, and top-k on the host keeps the routed sets the CPU path's.
template <class B>
Routing route(const B& be, const ModelConfig& cfg, const Mat& router, const float* x, int T, float* probs_out) {
  const int E = cfg.n_experts, K = cfg.top_k;
  typename B::Buf logits = be.alloc(size_t(T) * size_t(E));
  be.matmul(x, T, be.mat(router), logits.data());
  be.softmax(logits.data(), T, E);
  const std::vector<float> probs = be.to_host(std::move(logits));
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
template <class B>
void routed_experts(const B& be, const ModelConfig& cfg, const FfnWeights& w, const Routing& r, const float* x, int T,
                    float* out) {
  const int H = cfg.hidden, K = cfg.top_k;
  std::vector<std::vector<int>> users(size_t(cfg.n_experts));  // (token * K + slot) per expert
  std::vector<int> order;                                       // distinct experts, first use first
  for (int i = 0; i < T * K; ++i) {
    auto& u = users[size_t(r.ids[size_t(i)])];
    if (u.empty()) order.push_back(r.ids[size_t(i)]);
    u.push_back(i);
  }
  const auto groups = be.expert_groups(users, r.weights, K);

  // An expert serves each token at most once: T rows are enough for any of them.
  typename B::Buf partial = be.alloc(size_t(T) * size_t(K) * size_t(H));
  typename B::Buf xb = be.alloc(size_t(T) * size_t(H)), yb = be.alloc(size_t(T) * size_t(H));
  auto run = [&](int e, const MlpWeights& mlp) {
    be.gather_users(groups, e, x, H, xb.data());
    mlp_forward(be, mlp, xb.data(), int(users[size_t(e)].size()), yb.data());
    be.scatter_users(groups, e, yb.data(), H, partial.data());
  };
  if (w.store_layer < 0) {
    for (int e : order) run(e, be.mlp(w.experts[size_t(e)]));
  } else {
    auto* store = be.experts;
    const size_t cap = size_t(store->free_capacity(w.store_layer));
    for (size_t b = 0; b < order.size(); b += cap) {
      const std::vector<int> wave(order.begin() + std::ptrdiff_t(b), order.begin() + std::ptrdiff_t(std::min(order.size(), b + cap)));
      std::vector<const uint8_t*> records = store->acquire(w.store_layer, wave);
      for (size_t j = 0; j < wave.size(); ++j) run(wave[j], expert_weights(*w.record_layout, records[j]));
      store->release(w.store_layer);
    }
  }
  be.sum_slots(partial.data(), T, K, H, out);
}

}  // namespace

template <class B>
void ffn_block(const B& be, const ModelConfig& cfg, const FfnWeights& w, bool moe, const float* x, int T, float* out,
               int* routes, float* router_probs) {
  if (!moe) {
    mlp_forward(be, be.mlp(w.dense), x, T, out);
    return;
  }
  // The shared expert's gated add included (on the GPU, for a decode token's routed experts).
  if (be.moe_on_device(cfg, w, x, T, out, routes, router_probs)) return;
  // The shared expert before the routed ones: on the GPU it runs while the host reads the
  // layer's missing experts.
  typename B::Buf shared;
  if (cfg.shared_inter > 0) {
    shared = be.alloc(size_t(T) * size_t(cfg.hidden));
    mlp_forward(be, be.mlp(w.shared_expert), x, T, shared.data());
  }
  Routing r = route(be, cfg, w.router, x, T, router_probs);
  if (routes) std::copy(r.ids.begin(), r.ids.end(), routes);
  routed_experts(be, cfg, w, r, x, T, out);
  if (cfg.shared_inter > 0) be.shared_gate_add(out, shared.data(), x, be.mat(w.shared_expert_gate), T, cfg.hidden);
}

template void ffn_block(const CpuBackend&, const ModelConfig&, const FfnWeights&, bool, const float*, int, float*, int*,
                        float*);
#if MOESTREAM_CUDA
template void ffn_block(const CudaBackend&, const ModelConfig&, const FfnWeights&, bool, const float*, int, float*, int*,
                        float*);
template void mlp_forward(const CudaBackend&, const MlpWeights&, const float*, int, float*, float*, float*);
#endif

}  // namespace ms
