#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cpu/sample.h"
#include "kernels/cuda/stream.h"
#include "model/moe.h"
#include "util/error.h"

namespace ms {

void CudaBackend::matmul_stack(const float* x, int T, std::initializer_list<const Mat*> parts, float* y) const {
  if (const Mat* whole = weights.stacked(parts); whole && T == 1) return matmul(x, 1, *whole, y);
  for (const Mat* m : parts) {
    matmul(x, T, mat(*m), y);
    y += size_t(T) * size_t(m->rows);
  }
}

void CudaBackend::mlp(const MlpWeights& w, const float* x, int T, float* h, float* u, float* out) const {
  if (cuda::gate_up_fuses(w.gate, w.up, T)) {
    cuda::gate_up_silu(x, w.gate, w.up, h);
  } else {
    matmul(x, T, w.gate, h);
    matmul(x, T, w.up, u);
    cuda::silu_mul(h, u, h, int64_t(T) * w.gate.rows);
  }
  matmul(h, T, w.down, out);
}

void CudaBackend::moe(const ModelConfig& cfg, const FfnWeights& w, const float* x, int T, float* out, int* routes,
                      float* router_probs, const int* forced_routes) const {
  if (T == 1 && w.store_layer >= 0 && experts && !forced_routes) return moe_decode(cfg, w, x, out, routes, router_probs);
  if (w.store_layer >= 0) hand_over_predictions(w.store_layer);
  grouped_moe(*this, cfg, w, x, T, out, routes, router_probs, forced_routes);
}

int CudaBackend::pick(const float* logits, int vocab, const PickInputs& in) const {
  if (in.allowed) {  // constrained decoding: the CPU sampler's pick (the same semantics) over a copy
    thread_local cpu::SampleScratch scratch;
    std::vector<float> copy(static_cast<size_t>(vocab));
    cuda::copy_to_host(copy.data(), logits, size_t(vocab) * sizeof(float));
    return cpu::sample(copy.data(), vocab, in, scratch);
  }
  return cuda::pick(logits, vocab, in, state.sampler);
}

cuda::RecordMat record_mat(const ProjLayout& l) {
  return {.bits = l.bits, .group = l.group, .rows = l.rows, .cols = l.cols, .q_offset = l.q_offset,
          .scales_offset = l.scales_offset, .biases_offset = l.biases_offset, .scale_type = l.scale_type};
}

void CudaBackend::begin_decode_layer(const ModelConfig& cfg, const FfnWeights& w, const float* x, DecodeLayer& d) const {
  // The shared expert's buffers live past the join: taken and given back on the compute stream.
  const bool has_shared = cfg.shared_inter > 0;
  const size_t shared_inter = has_shared ? size_t(w.shared_expert.gate.rows) : 0;
  d.shared = alloc(has_shared ? size_t(cfg.hidden) : 0);
  d.shared_h = alloc(shared_inter), d.shared_u = alloc(shared_inter);
  if (has_shared) {
    d.side.emplace();
    mlp(mlp_weights(w.shared_expert), x, 1, d.shared_h.data(), d.shared_u.data(), d.shared.data());
    d.side->end();
  }
  const int E = cfg.n_experts, K = cfg.top_k, layer = w.store_layer;
  if ((size_t(layer) + 1) * size_t(K) > state.route_ids.size())
    fail("expert layer {} is past the {} layers of routes a forward keeps", layer, state.route_ids.size() / size_t(K));
  // The shared expert gate's logit after the router's, where its row was copied with theirs.
  d.gate_with_router = has_shared && weights.stacked({&w.router, &w.shared_expert_gate});
  d.logits = alloc(size_t(E) + 1), d.weights = alloc(size_t(K));
  d.ids = state.route_ids.data() + size_t(layer) * size_t(K);
  d.probs = state.route_probs.data() + size_t(layer) * size_t(E);
  if (d.gate_with_router) matmul_stack(x, 1, {&w.router, &w.shared_expert_gate}, d.logits.data());
  else matmul(x, 1, mat(w.router), d.logits.data());
  d.table = experts->resident_table(layer);
  d.records = cuda::DeviceArray<const uint8_t*>(size_t(K));
  for (int m = 0; m < 3; ++m) d.proj[m] = record_mat(w.record_layout->proj[size_t(m)]);
}

void CudaBackend::moe_decode(const ModelConfig& cfg, const FfnWeights& w, const float* x, float* out, int* routes,
                             float* router_probs) const {
  if (hybrid) return moe_decode_int(cfg, w, x, out, routes, router_probs);
  DecodeLayer d;
  begin_decode_layer(cfg, w, x, d);
  const int E = cfg.n_experts, K = cfg.top_k, layer = w.store_layer;
  Buf scratch = alloc(cuda::moe_scratch_floats(1, K, d.proj));
  const float* shared_out = d.gate_with_router ? d.shared.data() : nullptr;
  const cuda::InlineRoute route{.logits = d.logits.data(), .E = E, .norm_topk = cfg.norm_topk, .probs = d.probs, .ids = d.ids,
                                .weights = d.weights.data(), .table = d.table, .records = d.records.data()};
  if (cuda::routes_in_gate_up(route, K, d.proj)) {
    // The experts' first launch routes the token itself, and the shared expert joins before the
    // second, the first to read its output: no launch stands between the router and the experts,
    // and the shared expert runs beside both.
    cuda::moe_gate_up_routed(x, K, route, d.proj, scratch.data());
    if (d.side) d.side->join();
    cuda::moe_down(scratch.data(), 1, K, d.records.data(), d.weights.data(), d.proj, out, shared_out, d.logits.data() + E);
  } else {
    cuda::route_topk(d.logits.data(), 1, E, K, cfg.norm_topk, d.probs, d.ids, d.weights.data(), d.table, d.records.data());
    if (!d.table) {
      std::vector<int> host_ids(static_cast<size_t>(K));
      hand_over_predictions(layer);
      cuda::copy_to_host(host_ids.data(), d.ids, host_ids.size() * sizeof(int));
      experts->count_routes(layer, host_ids.data(), K);  // the usage history's counts
      const std::vector<const uint8_t*> acquired = experts->acquire(layer, host_ids);
      // Queued, not waited for: a synchronous copy would wait for the misses' copies the compute
      // stream now waits on, and the GPU would idle while the host queued what follows.
      cuda::copy_to_device_async(d.records.data(), acquired.data(), acquired.size() * sizeof(const uint8_t*));
    }
    if (d.side) d.side->join();
    cuda::moe_experts(x, 1, K, d.records.data(), d.weights.data(), d.proj, out, scratch.data(), shared_out, d.logits.data() + E);
  }
  if (cfg.shared_inter > 0 && !d.gate_with_router) shared_gate_add(out, d.shared.data(), x, mat(w.shared_expert_gate), 1, cfg.hidden);
  // Slots held until the kernels are queued: the copy stream orders any refill after them.
  if (!d.table) experts->release(layer);
  if (routes || router_probs) pending_routes.push_back({routes, router_probs, layer});
}

HybridExperts::Split CudaBackend::place_and_run(int layer, const GpuExperts& run) const {
  hybrid->settle();  // the last layer's GPU times: the wait above finished them
  const int* ids = hybrid->ids_host();
  const int K = state.top_k;
  experts->count_routes(layer, ids, K);  // the usage history's counts
  const HybridExperts::Split split = hybrid->place(layer, ids, K);
  std::vector<int> gpu_ids;
  for (int k : split.gpu_slots) gpu_ids.push_back(ids[k]);
  // The slots' records in a table of K, null for the slots that run elsewhere (or already ran).
  auto table_of = [&](const std::vector<const uint8_t*>& records, const std::vector<const uint8_t*>& skip) {
    std::vector<const uint8_t*> t(size_t(K), nullptr);
    for (size_t i = 0; i < split.gpu_slots.size(); ++i)
      if (skip.empty() || !skip[i]) t[size_t(split.gpu_slots[i])] = records[i];
    return t;
  };
  // The experts already in VRAM run while the misses' copies are queued and land; the copied
  // ones after them (the compute stream waits for the copies). A table with no slot is not run.
  auto run_some = [&](const std::vector<const uint8_t*>& t) {
    if (std::any_of(t.begin(), t.end(), [](const uint8_t* r) { return r != nullptr; })) run(t);
  };
  std::vector<const uint8_t*> ran;
  const std::vector<const uint8_t*> acquired = experts->acquire(layer, gpu_ids, [&](const std::vector<const uint8_t*>& resident) {
    run_some(table_of(resident, {}));
    ran = resident;
  });
  run_some(table_of(acquired, ran));
  return split;
}

void CudaBackend::moe_decode_int(const ModelConfig& cfg, const FfnWeights& w, const float* x, float* out, int* routes,
                                 float* router_probs) const {
  DecodeLayer d;
  begin_decode_layer(cfg, w, x, d);
  const int E = cfg.n_experts, K = cfg.top_k, H = cfg.hidden, layer = w.store_layer;
  const bool has_shared = cfg.shared_inter > 0;
  cuda::route_topk(d.logits.data(), 1, E, K, cfg.norm_topk, d.probs, d.ids, d.weights.data(), d.table, d.records.data());
  Buf partial = alloc(size_t(K) * size_t(H));
  cuda::DeviceArray<uint8_t> scratch(cuda::int_records_scratch_bytes(K, d.proj));
  auto run_gpu = [&](const uint8_t* const* device_records) {
    cuda::int_expert_records(x, K, device_records, d.weights.data(), d.proj, partial.data(), scratch.data());
  };
  if (d.table) {
    run_gpu(d.records.data());
  } else {
    hand_over_predictions(layer);
    // One wait brings the layer's input, ids and weights to the host (pinned: the three copies
    // queue together).
    cuda::copy_to_host_async(hybrid->x_host(), x, size_t(H) * sizeof(float));
    cuda::copy_to_host_async(hybrid->ids_host(), d.ids, size_t(K) * sizeof(int));
    cuda::copy_to_host_async(hybrid->weights_host(), d.weights.data(), size_t(K) * sizeof(float));
    hybrid->wait_for_compute();
    hybrid->gpu_experts().start();
    const HybridExperts::Split split = place_and_run(layer, [&](const std::vector<const uint8_t*>& host_table) {
      cuda::DeviceArray<const uint8_t*> part{size_t(K)};
      // Queued, not waited for (as moe_decode's): a synchronous copy would wait for the copies.
      cuda::copy_to_device_async(part.data(), host_table.data(), host_table.size() * sizeof(const uint8_t*));
      run_gpu(part.data());
    });
    hybrid->gpu_experts().stop();
    double cpu_s = 0;
    if (!split.cpu_slots.empty()) {
      hybrid->gpu_wait().start();
      cpu_s = hybrid->compute(layer, split.cpu_slots);
      for (int k : split.cpu_slots)
        cuda::copy_to_device_async(partial.data() + size_t(k) * size_t(H), hybrid->rows_host() + size_t(k) * size_t(H),
                                   size_t(H) * sizeof(float));
      hybrid->gpu_wait().stop();
    }
    hybrid->record(layer, split, cpu_s);
  }
  if (d.side) d.side->join();
  cuda::sum_slots(partial.data(), 1, K, H, out);
  if (d.gate_with_router) cuda::shared_logit_add(out, d.shared.data(), d.logits.data() + E, 1, H);
  else if (has_shared) shared_gate_add(out, d.shared.data(), x, mat(w.shared_expert_gate), 1, H);
  if (!d.table) experts->release(layer);
  if (routes || router_probs) pending_routes.push_back({routes, router_probs, layer});
}

static_assert(TogetherExperts<CudaBackend> && ElsewhereExperts<CudaBackend>, "model/moe.h would not take them");

std::vector<int> CudaBackend::take_elsewhere(int layer, const float* x, int T, std::vector<int>& order,
                                             const std::vector<std::vector<int>>& users) const {
  if (!hybrid || T < cuda::kIntGemmMinTokens || experts->resident_table(layer)) return {};
  chunk_split = hybrid->place_chunk(layer, order, users);
  const std::vector<int>& cpu = chunk_split.cpu;
  if (cpu.empty()) {
    hybrid->record_chunk(layer, chunk_split, 0);
    return {};
  }
  std::erase_if(order, [&](int e) { return std::find(cpu.begin(), cpu.end(), e) != cpu.end(); });
  size_t rows = 0;
  for (int e : cpu) rows += users[size_t(e)].size();
  hybrid->queue_chunk_input(x, T, rows);  // before the GPU's experts: the CPU need not wait for them
  return cpu;
}

void CudaBackend::run_elsewhere(int layer, const ExpertGroups& g, const std::vector<int>& cpu,
                                const std::vector<std::vector<int>>& users, float* partial) const {
  const int H = hybrid->hidden(), K = state.top_k;
  const double cpu_s = hybrid->compute_chunk(layer, cpu, users, K);
  size_t rows = 0;
  for (int e : cpu) rows += users[size_t(e)].size();
  Buf up = alloc(rows * size_t(H));
  cuda::copy_to_device_async(up.data(), hybrid->chunk_rows(), up.bytes());
  size_t at = 0;
  for (int e : cpu) {
    scatter_users(g, e, up.data() + at * size_t(H), H, partial);
    at += users[size_t(e)].size();
  }
  hybrid->record_chunk(layer, chunk_split, cpu_s);
}

void CudaBackend::to_host_later(const Buf& b, int target, std::function<void(const float*)> then) const {
  PredictionSlots& slots = state.prediction_slots();
  const int slot = slots.put(b.data(), b.size());
  std::erase_if(pending_predictions, [&](const PendingPrediction& p) { return p.slot == slot; });  // wrapped round
  pending_predictions.push_back({target, slot, std::move(then)});
}

void CudaBackend::hand_over_predictions(int layer) const {
  if (pending_predictions.empty()) return;
  const PredictionSlots& slots = state.prediction_slots();
  for (const PendingPrediction& p : pending_predictions)
    if (p.target >= layer) p.then(slots.take(p.slot));
  pending_predictions.clear();
}

void CudaBackend::finish() const {
  if (pending_routes.empty()) return;
  const size_t K = size_t(state.top_k), E = size_t(state.n_experts);
  const std::vector<int> ids = state.route_ids.to_vector();
  const std::vector<float> probs = state.route_probs.to_vector();
  for (const PendingRoutes& p : pending_routes) {
    if (p.ids) std::copy_n(ids.data() + size_t(p.layer) * K, K, p.ids);
    if (p.probs) std::copy_n(probs.data() + size_t(p.layer) * E, E, p.probs);
  }
  pending_routes.clear();
}

void CudaBackend::route_topk(const float* logits, int T, int E, int K, bool norm_topk, int* ids, float* weights,
                             float* probs) const {
  const size_t n = size_t(T) * size_t(K);
  const Buf p = alloc(size_t(T) * size_t(E));
  cuda::DeviceArray<int> routed(2 * n);  // ids, then the weights' bits: one copy back
  cuda::route_topk(logits, T, E, K, norm_topk, p.data(), routed.data(), reinterpret_cast<float*>(routed.data() + n));
  std::vector<int> host = routed.to_vector();
  std::copy_n(host.data(), n, ids);
  std::memcpy(weights, host.data() + n, n * sizeof(float));
  if (probs) cuda::copy_to_host(probs, p.data(), p.bytes());
}

CudaBackend::ExpertGroups CudaBackend::expert_groups(const std::vector<std::vector<int>>& users,
                                                     const std::vector<float>& weights, int K) const {
  std::vector<size_t> first{0};
  for (const auto& u : users) first.push_back(first.back() + u.size());
  const size_t total = first.back();
  std::vector<int> rows(2 * total);
  std::vector<float> wt(total);
  for (size_t e = 0, j = 0; e < users.size(); ++e)
    for (int u : users[e]) {
      rows[j] = u / K;
      rows[total + j] = u;
      wt[j++] = weights[size_t(u)];
    }
  return {cuda::DeviceArray<int>::from_async(rows), cuda::DeviceArray<float>::from_async(wt), std::move(first)};
}

namespace {

bool same_layout(const Mat& a, const Mat& b) {
  return a.bits == b.bits && a.group == b.group && a.scale_type == b.scale_type && a.rows == b.rows && a.cols == b.cols;
}

}  // namespace

void CudaBackend::run_together(const ExpertGroups& g, const std::vector<ExpertCall>& calls, const float* x, int T,
                               float* partial) const {
  const size_t total = g.first.back();
  auto of = [](const Mat& m) { return cuda::IntExpertMat{static_cast<const uint8_t*>(m.data), m.scales, m.biases}; };
  // One launch set for each layout among the calls (a layer's experts normally share one).
  std::vector<bool> done(calls.size(), false);
  for (size_t first = 0; first < calls.size(); ++first) {
    if (done[first]) continue;
    const MlpWeights& lead = calls[first].w;
    std::vector<cuda::IntExpertMat> gate, up, down;
    std::vector<size_t> begin, end;
    for (size_t i = first; i < calls.size(); ++i) {
      const MlpWeights& w = calls[i].w;
      if (done[i] || !same_layout(w.gate, lead.gate) || !same_layout(w.up, lead.up) || !same_layout(w.down, lead.down))
        continue;
      done[i] = true;
      gate.push_back(of(w.gate)), up.push_back(of(w.up)), down.push_back(of(w.down));
      begin.push_back(g.first[size_t(calls[i].expert)]), end.push_back(g.first[size_t(calls[i].expert) + 1]);
    }
    cuda::int_experts({.n = int(gate.size()), .gate = gate.data(), .up = up.data(), .down = down.data(),
                       .gate_layout = lead.gate, .down_layout = lead.down, .begin = begin.data(), .end = end.data(),
                       .users_total = int(total), .token_rows = g.rows.data(), .users = g.rows.data() + total,
                       .weights = g.weights.data()},
                      x, T, partial);
  }
}

}  // namespace ms
