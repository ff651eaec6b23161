#pragma once
// The MoE layer as a batch runs it on any backend: the routed ids to the host (top-k on the
// device where the backend has one, else on the host), the tokens grouped by expert, each routed
// expert run once over its tokens (streamed experts in waves of at most the layer's free pool
// slots), the per-(token, slot) results summed in top-k order, and the gated shared expert added.
// Backends call it from their moe() where no fused path of their own applies; it is written over
// the primitives GroupedMoe names.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "format/config.h"
#include "kernels/cpu/ops.h"
#include "model/weights.h"

namespace ms {

template <class B>
concept GroupedMoe = requires(const B& be, const Mat& m, const MlpWeights& mlp, const float* x, float* y, int n,
                              const std::vector<std::vector<int>>& users, const std::vector<float>& weights) {
  be.matmul(x, n, m, y);
  be.softmax(y, n, n);
  be.mlp(mlp, x, n, y);
  be.expert_groups(users, weights, n);  // the users of every expert, where the backend reads them
  be.gather_users(be.expert_groups(users, weights, n), n, x, n, y);
  be.scatter_users(be.expert_groups(users, weights, n), n, x, n, y);
  be.sum_slots(x, n, n, n, y);
  be.shared_gate_add(y, x, x, m, n, n);
  { be.experts->free_capacity(n) } -> std::convertible_to<int>;  // the streamed experts' pool
};

struct Routing {
  std::vector<int> ids;        // [T, top_k], largest probability first
  std::vector<float> weights;  // [T, top_k]
};

// The routed ids come to the host: grouping tokens by expert needs them there. A backend with a
// top-k of its own (route_topk, the same arithmetic) sends only them; otherwise the router's
// probabilities come over and top-k runs on the host.
// `forced` (T·K ids, ForwardOptions::routes_from) replaces the top-k: the router's probabilities
// of those ids weight them.
template <GroupedMoe B>
Routing route(const B& be, const ModelConfig& cfg, const Mat& router, const float* x, int T, float* probs_out,
              const int* forced = nullptr) {
  const int E = cfg.n_experts, K = cfg.top_k;
  typename B::Buf logits = be.alloc(size_t(T) * size_t(E));
  be.matmul(x, T, be.mat(router), logits.data());
  Routing r{std::vector<int>(size_t(T) * size_t(K)), std::vector<float>(size_t(T) * size_t(K))};
  if constexpr (requires { be.route_topk(logits.data(), T, E, K, cfg.norm_topk, r.ids.data(), r.weights.data(), probs_out); }) {
    if (!forced) {
      be.route_topk(logits.data(), T, E, K, cfg.norm_topk, r.ids.data(), r.weights.data(), probs_out);
      return r;
    }
  }
  be.softmax(logits.data(), T, E);
  const std::vector<float> probs = be.to_host(std::move(logits));
  for (int t = 0; t < T; ++t) {
    const float* p = probs.data() + size_t(t) * size_t(E);
    int* ids = r.ids.data() + size_t(t) * size_t(K);
    float* wt = r.weights.data() + size_t(t) * size_t(K);
    if (forced) std::copy_n(forced + size_t(t) * size_t(K), K, ids);
    else cpu::top_k(p, E, K, ids);
    float sum = 0.f;
    for (int k = 0; k < K; ++k) sum += (wt[k] = p[ids[k]]);
    if (cfg.norm_topk)
      for (int k = 0; k < K; ++k) wt[k] /= sum;
  }
  if (probs_out) std::copy(probs.begin(), probs.end(), probs_out);
  return r;
}

// Whether B's expert store reads in the background (ExpertStore::start_acquire): the host then
// computes while a layer's misses are read.
template <class B>
concept AsyncExperts = requires(const B& be) { be.experts->start_acquire(0, std::vector<int>{}).next_batch(); };

// Runs the MLPs together where B can (one parallel region for all of them on the CPU), else one
// after another; the results are the same bits either way.
template <class B>
void run_mlps(const B& be, const std::vector<MlpCall>& calls) {
  if constexpr (requires { be.mlps(calls); }) {
    be.mlps(calls);
  } else {
    for (const MlpCall& c : calls) be.mlp(c.w, c.x, c.n, c.y);
  }
}

// A routed expert for a backend that runs several from x together (TogetherExperts).
struct ExpertCall {
  int expert;
  MlpWeights w;
};

// Whether B runs some experts of a T-token forward together, each over its users straight from x
// into `partial` (the CUDA backend's integer GEMM): it says which (runs_together), and runs a
// batch of them where routed_experts would flush.
template <class B>
concept TogetherExperts =
    GroupedMoe<B> && requires(const B& be, const MlpWeights& w, const float* x, float* y,
                              const std::vector<ExpertCall>& calls, const std::vector<std::vector<int>>& users,
                              const std::vector<float>& weights) {
      { be.runs_together(w, 0) } -> std::convertible_to<bool>;
      be.run_together(be.expert_groups(users, weights, 0), calls, x, 0, y);
    };

// Whether B computes some of a T-token forward's experts elsewhere beside its own (the CUDA
// backend's hybrid prefill: on the CPU): take_elsewhere removes them from `order` before the
// rest are queued, and run_elsewhere computes them and puts their users' rows into `partial`
// (the same bits as the backend's own) once the rest are queued.
template <class B>
concept ElsewhereExperts =
    GroupedMoe<B> && requires(const B& be, const float* x, float* y, std::vector<int>& order,
                              const std::vector<std::vector<int>>& users, const std::vector<float>& weights) {
      { be.take_elsewhere(0, x, 0, order, users) } -> std::same_as<std::vector<int>>;
      be.run_elsewhere(0, be.expert_groups(users, weights, 0), std::vector<int>{}, users, y);
    };

// Forwards of at most this many (token, slot) pairs run the experts that are ready together;
// longer ones (prompt chunks) give each expert enough rows to amortise its own barriers.
constexpr int kBatchedExpertRows = 64;

// Runs each routed expert once over the tokens that chose it. Per-(token, slot) results are
// summed in top-k order afterwards, so the answer depends neither on the order experts run in
// nor on how they are split into waves or batches. `first` (the shared expert, may be null) runs
// with the first experts ready: while the first wave's misses are read where the store reads in
// the background, else before the routed experts.
template <GroupedMoe B>
void routed_experts(const B& be, const ModelConfig& cfg, const FfnWeights& w, const Routing& r, const float* x, int T,
                    float* out, const MlpCall* first = nullptr) {
  const int H = cfg.hidden, K = cfg.top_k;
  std::vector<std::vector<int>> users(size_t(cfg.n_experts));  // (token * K + slot) per expert
  std::vector<int> order;                                       // distinct experts, first use first
  for (int i = 0; i < T * K; ++i) {
    auto& u = users[size_t(r.ids[size_t(i)])];
    if (u.empty()) order.push_back(r.ids[size_t(i)]);
    u.push_back(i);
  }
  const auto groups = be.expert_groups(users, r.weights, K);

  // Batched, the experts' gathered rows lie side by side (T·K rows in all); one at a time, an
  // expert serves each token at most once: T rows are enough.
  const bool batched = T * K <= kBatchedExpertRows;
  const size_t rows = size_t(batched ? T * K : T) * size_t(H);
  typename B::Buf partial = be.alloc(size_t(T) * size_t(K) * size_t(H));
  typename B::Buf xb, yb;  // taken for the first expert that runs alone (none when all run together)
  bool have_rows = false;
  std::vector<MlpCall> calls;
  std::vector<int> experts;        // calls[i] runs experts[i] (-1: `first`)
  std::vector<ExpertCall> together;  // TogetherExperts: run from x into partial at the flush
  size_t at = 0;                   // rows of xb in use by the calls
  auto flush = [&] {
    run_mlps(be, calls);
    for (size_t i = 0; i < calls.size(); ++i)
      if (experts[i] >= 0) be.scatter_users(groups, experts[i], calls[i].y, H, partial.data());
    if constexpr (TogetherExperts<B>) {
      if (!together.empty()) be.run_together(groups, together, x, T, partial.data());
      together.clear();
    }
    calls.clear(), experts.clear(), at = 0;
  };
  auto add_first = [&] {
    if (!first) return;
    calls.push_back(*first), experts.push_back(-1), first = nullptr;
    if (!batched) flush();  // alone: a prompt chunk's activations are planned one MLP at a time
  };
  auto add = [&](int e, const MlpWeights& mlp) {
    if constexpr (TogetherExperts<B>) {
      if (be.runs_together(mlp, T)) return together.push_back({e, mlp});
    }
    if (!have_rows) xb = be.alloc(rows), yb = be.alloc(rows), have_rows = true;
    const int n = int(users[size_t(e)].size());
    be.gather_users(groups, e, x, H, xb.data() + at);
    calls.push_back({mlp, xb.data() + at, n, yb.data() + at});
    experts.push_back(e);
    at += size_t(n) * size_t(H);
    if (!batched) flush();
  };
  if (w.store_layer < 0) {
    add_first();
    for (int e : order) add(e, be.mlp_weights(w.experts[size_t(e)]));
    flush();
  } else {
    auto* store = be.experts;
    if constexpr (requires { store->count_routes(0, r.ids.data(), 0); })  // the usage history's counts
      store->count_routes(w.store_layer, r.ids.data(), T * K);
    std::vector<int> elsewhere;
    if constexpr (ElsewhereExperts<B>) elsewhere = be.take_elsewhere(w.store_layer, x, T, order, users);
    const size_t cap = size_t(store->free_capacity(w.store_layer));
    for (size_t b = 0; b < order.size(); b += cap) {
      const std::vector<int> wave(order.begin() + std::ptrdiff_t(b), order.begin() + std::ptrdiff_t(std::min(order.size(), b + cap)));
      if constexpr (AsyncExperts<B>) {
        // The experts resident now run (together) while the misses are read, then each batch of
        // misses as its reads complete.
        auto acquired = store->start_acquire(w.store_layer, wave);
        add_first();
        for (std::vector<int> ready; !(ready = acquired.next_batch()).empty();) {
          for (int j : ready) add(wave[size_t(j)], expert_weights(*w.record_layout, acquired.records[size_t(j)]));
          flush();
        }
      } else {
        add_first();
        const std::vector<const uint8_t*> records = store->acquire(w.store_layer, wave);
        for (size_t j = 0; j < wave.size(); ++j) add(wave[j], expert_weights(*w.record_layout, records[j]));
        flush();
      }
      store->release(w.store_layer);
    }
    if constexpr (ElsewhereExperts<B>) {
      add_first();
      flush();
      if (!elsewhere.empty()) be.run_elsewhere(w.store_layer, groups, elsewhere, users, partial.data());
    }
  }
  add_first();
  flush();
  be.sum_slots(partial.data(), T, K, H, out);
}

// The whole MoE layer: shared expert, router, routed experts, the shared expert's gated add.
template <GroupedMoe B>
void grouped_moe(const B& be, const ModelConfig& cfg, const FfnWeights& w, const float* x, int T, float* out,
                 int* routes, float* router_probs, const int* forced_routes = nullptr) {
  typename B::Buf shared;
  MlpCall shared_call{};
  if (cfg.shared_inter > 0) {
    shared = be.alloc(size_t(T) * size_t(cfg.hidden));
    shared_call = {be.mlp_weights(w.shared_expert), x, T, shared.data()};
  }
  // The shared expert runs while the layer's missing experts are read: on the host with the
  // resident routed experts, after the routing has issued the reads; on the GPU first, queued
  // while the host routes and reads.
  const bool after_routing = AsyncExperts<B> && w.store_layer >= 0;
  if (cfg.shared_inter > 0 && !after_routing) be.mlp(shared_call.w, x, T, shared.data());
  Routing r = route(be, cfg, w.router, x, T, router_probs, forced_routes);
  if (routes) std::copy(r.ids.begin(), r.ids.end(), routes);
  routed_experts(be, cfg, w, r, x, T, out, cfg.shared_inter > 0 && after_routing ? &shared_call : nullptr);
  if (cfg.shared_inter > 0) be.shared_gate_add(out, shared.data(), x, be.mat(w.shared_expert_gate), T, cfg.hidden);
}

}  // namespace ms
