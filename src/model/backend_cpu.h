#pragma once
// The CPU backend of the forward (model/blocks.h): activations in host vectors, the cpu::
// kernels, and the model's glue loops written out. The forward's numerics on the CPU are these.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "kernels/cpu/deltanet.h"
#include "kernels/cpu/ops.h"
#include "experts/expert_store.h"
#include "model/state.h"
#include "model/weights.h"

namespace ms {

struct CpuBackend {
  using Buf = std::vector<float>;
  using KV = KVCache;
  using Linear = LinearState;
  static constexpr bool kOnDevice = false;

  State& state;
  ExpertStore* experts = nullptr;  // an engine directory's streamed experts

  // Activations.
  Buf alloc(size_t n) const { return Buf(n); }
  Buf upload(std::vector<float> host) const { return host; }
  std::vector<float> to_host(Buf b) const { return b; }
  // Weights as the kernels take them.
  const Mat& mat(const Mat& m) const { return m; }
  const MlpWeights& mlp(const MlpWeights& m) const { return m; }
  const float* vec(const std::vector<float>& v) const { return v.data(); }
  // The sequence's caches.
  KV& kv(int layer) const { return state.kv(layer); }
  KV& mtp_kv() const { return state.mtp_kv(); }
  Linear& linear(int layer) const { return state.linear(layer); }

  void matmul(const float* x, int T, const Mat& W, float* y) const { cpu::matmul(x, T, W, y); }
  // x · Wᵀ for each part W in turn, part after part in y ([T, rows] each).
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
    add(x, y, size_t(rows) * size_t(dim));
    rmsnorm(x, rows, dim, w, offset, eps, out);
  }
  void rope(float* x, int T, int heads, int head_dim, int rot_dim, int pos0, double theta) const {
    cpu::rope(x, T, heads, head_dim, rot_dim, pos0, theta);
  }
  // out *= sigmoid(gate) elementwise after the attention where gate is given (a gated layer's).
  void attention(const float* q, KV& cache, int T, int pos0, int nh, int nkv, int hd, const float* gate,
                 float* out) const {
    cpu::attention(q, cache.k_at(0), cache.v_at(0), T, pos0, nh, nkv, hd, out);
    if (!gate) return;
    const size_t n = size_t(T) * size_t(nh) * size_t(hd);
    for (size_t i = 0; i < n; ++i) out[i] *= cpu::sigmoid(gate[i]);
  }
  // q and the caches' k and v of an attention layer from its projections
  // (cuda::attention_prepare's formulas): the split of a gated q_raw, the norms, RoPE and the
  // store of k and v at positions pos0.., in turn.
  void attention_prepare(const float* q_raw, const float* k, const float* v, int T, int nh, int nkv, int hd, bool gated,
                         const float* q_norm, const float* k_norm, float offset, float eps, int rot_dim, int pos0,
                         double theta, float* q, float* gate, KV& cache) const;
  // k and v [T, n_kv * head_dim] into the cache at positions pos0..
  void store_kv(KV& cache, int pos0, int T, const float* k, const float* v) const {
    const size_t n = size_t(T) * size_t(cache.n_kv) * size_t(cache.head_dim);
    std::copy_n(k, n, cache.k_at(pos0));
    std::copy_n(v, n, cache.v_at(pos0));
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) const { cpu::silu_mul(gate, up, out, n); }
  // mlp_forward's gate and up run as two matmuls and silu_mul on the CPU.
  bool fused_gate_up(const float*, int, const Mat&, const Mat&, float*) const { return false; }
  void softmax(float* x, int rows, int n) const { cpu::softmax(x, rows, n); }
  void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T, int nk,
                        int nv, int dk, int dv, float* st, float* out) const {
    cpu::gated_delta_rule(q, k, v, g, beta, T, nk, nv, dk, dv, st, out);
  }
  void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out) const {
    cpu::rmsnorm_gated(x, z, w, rows, dim, eps, out);
  }

  // The CPU has no decode-only MoE path: ffn_block's grouping serves every T.
  bool moe_on_device(const ModelConfig&, const FfnWeights&, const float*, int, float*, int*, float*) const { return false; }
  void finish() const {}

  void add(float* x, const float* y, size_t n) const {
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
  }
  void copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t width, size_t rows) const {
    for (size_t r = 0; r < rows; ++r) std::copy_n(src + r * src_stride, width, dst + r * dst_stride);
  }
  // The gated delta rule's inputs from the projections (cuda::deltanet_prepare's formulas): the
  // split of qkvz and ba, the conv over q, k and v, their norms and the gates, in turn.
  void deltanet_prepare(const float* qkvz, const float* ba, int T, int nk, int nv, int dk, int dv, const float* conv_w,
                        int conv_k, float* conv_state, const float* A_log, const float* dt_bias, float eps,
                        float q_scale, float* q, float* k, float* v, float* z, float* g, float* beta) const;
  // out[t] += sigmoid(gate · x[t]) * s[t]: the shared expert's gated contribution.
  void shared_gate_add(float* out, const float* s, const float* x, const Mat& gate_w, int T, int H) const {
    Buf g(static_cast<size_t>(T));
    matmul(x, T, gate_w, g.data());
    for (int t = 0; t < T; ++t) {
      const float gate = cpu::sigmoid(g[size_t(t)]);
      for (int h = 0; h < H; ++h) out[size_t(t) * size_t(H) + size_t(h)] += gate * s[size_t(t) * size_t(H) + size_t(h)];
    }
  }

  // The routed experts' users: (token * K + slot) per expert, and the routing weight of each.
  struct ExpertGroups {
    const std::vector<std::vector<int>>& users;
    const std::vector<float>& weights;
    int K;
  };
  ExpertGroups expert_groups(const std::vector<std::vector<int>>& users, const std::vector<float>& weights, int K) const {
    return {users, weights, K};
  }
  // xb[j] = x[token of user j of expert e]
  void gather_users(const ExpertGroups& g, int e, const float* x, int H, float* xb) const {
    const auto& u = g.users[size_t(e)];
    for (size_t j = 0; j < u.size(); ++j) std::copy_n(x + size_t(u[j] / g.K) * size_t(H), H, xb + j * size_t(H));
  }
  // partial[user j of expert e] = weight * yb[j]
  void scatter_users(const ExpertGroups& g, int e, const float* yb, int H, float* partial) const {
    const auto& u = g.users[size_t(e)];
    for (size_t j = 0; j < u.size(); ++j) {
      const float wt = g.weights[size_t(u[j])];
      float* dst = partial + size_t(u[j]) * size_t(H);
      for (int h = 0; h < H; ++h) dst[h] = wt * yb[j * size_t(H) + size_t(h)];
    }
  }
  void sum_slots(const float* partial, int T, int K, int H, float* out) const {
    for (int t = 0; t < T; ++t) {
      float* o = out + size_t(t) * size_t(H);
      std::fill(o, o + H, 0.f);
      for (int k = 0; k < K; ++k) {
        const float* p = partial + (size_t(t) * size_t(K) + size_t(k)) * size_t(H);
        for (int h = 0; h < H; ++h) o[h] += p[h];
      }
    }
  }
};

}  // namespace ms
