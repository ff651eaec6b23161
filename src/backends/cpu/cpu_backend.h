#pragma once
// The CPU backend (model/backend.h): activations in host vectors, the cpu:: kernels, the
// routed experts of an engine directory from the host's expert store. The forward's numerics on
// the CPU are these; the CUDA backend is tested against them.
#include <algorithm>
#include <initializer_list>
#include <vector>

#include "experts/expert_store.h"
#include "kernels/cpu/deltanet.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sample.h"
#include "model/state.h"
#include "model/weights.h"

namespace ms {

struct CpuBackend {
  using Buf = std::vector<float>;
  using KV = KVCache;
  using Linear = LinearState;

  State& state;
  ExpertStore* experts = nullptr;  // an engine directory's streamed experts

  // Activations.
  Buf alloc(size_t n) const { return Buf(n); }
  Buf upload(std::vector<float> host) const { return host; }
  std::vector<float> to_host(Buf b) const { return b; }
  // Weights as the kernels take them: as they are.
  const Mat& mat(const Mat& m) const { return m; }
  const MlpWeights& mlp_weights(const MlpWeights& m) const { return m; }
  const float* vec(const std::vector<float>& v) const { return v.data(); }
  // The sequence's caches.
  KV& kv(int layer) const { return state.kv(layer); }
  KV& mtp_kv() const { return state.mtp_kv(); }
  Linear& linear(int layer) const { return state.linear(layer); }

  void matmul(const float* x, int T, const Mat& W, float* y) const { cpu::matmul(x, T, W, y); }
  void matmul_stack(const float* x, int T, std::initializer_list<const Mat*> parts, float* y) const {
    for (const Mat* m : parts) {
      matmul(x, T, *m, y);
      y += size_t(T) * size_t(m->rows);
    }
  }
  void rmsnorm(const float* x, int rows, int dim, const float* w, float offset, float eps, float* out) const {
    cpu::rmsnorm(x, rows, dim, w, offset, eps, out);
  }
  void add_rmsnorm(float* x, const float* y, int rows, int dim, const float* w, float offset, float eps,
                   float* out) const {
    const size_t n = size_t(rows) * size_t(dim);
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
    rmsnorm(x, rows, dim, w, offset, eps, out);
  }
  // A float32 cache takes k and v in place; any other has them rotated and encoded
  // (cpu::kv_store) from rows of their own.
  void attention_prepare(const float* q_raw, const float* k, const float* v, int T, int nh, int nkv, int hd, bool gated,
                         const float* q_norm, const float* k_norm, float offset, float eps, int rot_dim, int pos0,
                         double theta, float* q, float* gate, KV& cache) const {
    const size_t rows = size_t(T) * size_t(nkv);
    Buf k_rows(cache.exact() ? 0 : rows * size_t(hd)), v_rows(k_rows.size());
    float* k_out = cache.exact() ? reinterpret_cast<float*>(cache.k_at(pos0)) : k_rows.data();
    float* v_out = cache.exact() ? reinterpret_cast<float*>(cache.v_at(pos0)) : v_rows.data();
    cpu::attention_prepare({.q_raw = q_raw, .k = k, .v = v, .q_norm = q_norm, .k_norm = k_norm, .q = q, .gate = gate,
                            .k_out = k_out, .v_out = v_out, .theta = theta, .offset = offset, .eps = eps, .T = T,
                            .nh = nh, .nkv = nkv, .hd = hd, .rot_dim = rot_dim, .pos0 = pos0, .gated = gated});
    if (cache.exact()) return;
    cpu::kv_store(k_out, rows, hd, cache.k_side, cache.k_rot.get(), cache.k_at(pos0));
    cpu::kv_store(v_out, rows, hd, cache.v_side, cache.v_rot.get(), cache.v_at(pos0));
  }
  // Over rotated keys q takes their rotation, and over rotated values the output is rotated back
  // (quant/kv_quant.h: KvRotator), before the gate.
  void attention(const float* q, KV& cache, int T, int pos0, int nh, int nkv, int hd, const float* gate,
                 float* out) const {
    const size_t rows = size_t(T) * size_t(nh);
    Buf q_rot;
    if (cache.k_rot) {
      q_rot.assign(q, q + rows * size_t(hd));
      cache.k_rot->apply(q_rot.data(), rows);
      q = q_rot.data();
    }
    cpu::attention(q, cpu::KvRows{cache.k_at(0), cache.k_side}, cpu::KvRows{cache.v_at(0), cache.v_side}, T, pos0, nh,
                   nkv, hd, out);
    if (cache.v_rot) cache.v_rot->undo(out, rows);
    if (gate) cpu::sigmoid_gate(out, gate, rows * size_t(hd));
  }
  void deltanet_prepare(const float* qkvz, const float* ba, int T, int nk, int nv, int dk, int dv, const float* conv_w,
                        int conv_k, float* conv_state, const float* A, const float* dt_bias, float eps,
                        float q_scale, float* q, float* k, float* v, float* z, float* g, float* beta) const {
    cpu::deltanet_prepare({.qkvz = qkvz, .ba = ba, .conv_w = conv_w, .A = A, .dt_bias = dt_bias,
                           .conv_state = conv_state, .q = q, .k = k, .v = v, .z = z, .g = g, .beta = beta, .T = T,
                           .nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = conv_k, .eps = eps, .q_scale = q_scale});
  }
  void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T, int nk,
                        int nv, int dk, int dv, float* st, float* out) const {
    cpu::gated_delta_rule(q, k, v, g, beta, T, nk, nv, dk, dv, st, out);
  }
  // Speculative verification's copy of a linear-attention state after token t (State::step_state).
  void keep_linear_step(const Linear& s, int t, int layer) const { state.step_state(t, layer) = s; }
  void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out) const {
    cpu::rmsnorm_gated(x, z, w, rows, dim, eps, out);
  }
  // down(silu(gate x) * up x): two matmuls, silu_mul, a matmul.
  void mlp(const MlpWeights& w, const float* x, int T, float* out) const {
    const size_t n = size_t(T) * size_t(w.gate.rows);
    Buf h(n), u(n);
    matmul(x, T, w.gate, h.data());
    matmul(x, T, w.up, u.data());
    cpu::silu_mul(h.data(), u.data(), h.data(), int64_t(n));
    matmul(h.data(), T, w.down, out);
  }
  // Several MLPs (a layer's ready experts, the shared expert) in two parallel regions where
  // their matrices are all quantized, gate and up together then down: one barrier for all of
  // them rather than three each. The same bits as mlp() on each.
  void mlps(const std::vector<MlpCall>& calls) const;
  // Every batch's MoE as model/moe.h groups it.
  void moe(const ModelConfig& cfg, const FfnWeights& w, const float* x, int T, float* out, int* routes,
           float* router_probs, const int* forced_routes) const;
  int pick(const float* logits, int vocab, const PickInputs& in) const;
  void finish() const {}
  ExpertPrefetcher* prefetch_store() const { return experts && experts->prefetching() ? experts : nullptr; }

  // model/moe.h's primitives.
  void softmax(float* x, int rows, int n) const { cpu::softmax(x, rows, n); }
  cpu::ExpertUsers expert_groups(const std::vector<std::vector<int>>& users, const std::vector<float>& weights,
                                 int K) const {
    return {users, weights, K};
  }
  void gather_users(const cpu::ExpertUsers& g, int e, const float* x, int H, float* xb) const {
    cpu::gather_users(g, e, x, H, xb);
  }
  void scatter_users(const cpu::ExpertUsers& g, int e, const float* yb, int H, float* partial) const {
    cpu::scatter_users(g, e, yb, H, partial);
  }
  void sum_slots(const float* partial, int T, int K, int H, float* out) const { cpu::sum_slots(partial, T, K, H, out); }
  void shared_gate_add(float* out, const float* s, const float* x, const Mat& gate_w, int T, int H) const {
    cpu::shared_gate_add(out, s, x, gate_w, T, H);
  }
};

}  // namespace ms
