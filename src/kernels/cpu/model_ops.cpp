#include "kernels/cpu/model_ops.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/deltanet.h"
#include "kernels/cpu/ops.h"

namespace ms::cpu {

namespace {

void copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t width, size_t rows) {
  for (size_t r = 0; r < rows; ++r) std::copy_n(src + r * src_stride, width, dst + r * dst_stride);
}

float softplus(float v) { return v > 20.f ? v : std::log1p(std::exp(v)); }  // torch's threshold

// The public checkpoints group in_proj_qkvz by key head: [q(dk), k(dk), v(r·dv), z(r·dv)] for
// each of the nk key heads (r = value heads per key head), and in_proj_ba as [b(r), a(r)].
// Regroup into the conv's channel order (all q, all k, all v) and separate z, b, a.
void deltanet_split(const float* qkvz, const float* ba, int T, int nk, int nv, int dk, int dv, float* qkv_out, float* z,
                    float* b, float* a) {
  const int r = nv / nk;
  const size_t key_dim = size_t(nk) * size_t(dk), value_dim = size_t(nv) * size_t(dv);
  const size_t conv_dim = 2 * key_dim + value_dim, group = size_t(2 * dk + 2 * r * dv);
  for (size_t t = 0; t < size_t(T); ++t) {
    float* qkv = qkv_out + t * conv_dim;
    for (size_t h = 0; h < size_t(nk); ++h) {
      const float* src = qkvz + t * size_t(nk) * group + h * group;
      const size_t vw = size_t(r) * size_t(dv);
      std::copy_n(src, dk, qkv + h * size_t(dk));
      std::copy_n(src + dk, dk, qkv + key_dim + h * size_t(dk));
      std::copy_n(src + 2 * dk, vw, qkv + 2 * key_dim + h * vw);
      std::copy_n(src + 2 * dk + vw, vw, z + t * value_dim + h * vw);
      const float* bsrc = ba + t * 2 * size_t(nv) + h * 2 * size_t(r);
      std::copy_n(bsrc, r, b + t * size_t(nv) + h * size_t(r));
      std::copy_n(bsrc + r, r, a + t * size_t(nv) + h * size_t(r));
    }
  }
}

void deltanet_gates(const float* b, const float* a, const float* A, const float* dt_bias, int T, int nv, float* g,
                    float* beta) {
  for (size_t i = 0; i < size_t(T) * size_t(nv); ++i) {
    const size_t h = i % size_t(nv);
    beta[i] = sigmoid(b[i]);
    g[i] = A[h] * softplus(a[i] + dt_bias[h]);
  }
}

}  // namespace

void attention_prepare(const AttentionPrepareArgs& a) {
  const size_t rows = size_t(a.T) * size_t(a.nh), kv_size = size_t(a.T) * size_t(a.nkv) * size_t(a.hd);
  const size_t hd = size_t(a.hd);
  if (a.gated) {
    copy_rows(a.q, hd, a.q_raw, 2 * hd, hd, rows);
    copy_rows(a.gate, hd, a.q_raw + hd, 2 * hd, hd, rows);
  } else {
    std::copy_n(a.q_raw, rows * hd, a.q);
  }
  rmsnorm(a.q, int(rows), a.hd, a.q_norm, a.offset, a.eps, a.q);
  rmsnorm(a.k, a.T * a.nkv, a.hd, a.k_norm, a.offset, a.eps, a.k_out);
  rope(a.q, a.T, a.nh, a.hd, a.rot_dim, a.pos0, a.theta);
  rope(a.k_out, a.T, a.nkv, a.hd, a.rot_dim, a.pos0, a.theta);
  std::copy_n(a.v, kv_size, a.v_out);
}

void kv_store(const float* rows, size_t n, int hd, KvSide side, const KvRotator* rot, uint8_t* out) {
  std::vector<float> row(static_cast<size_t>(hd));
  const size_t stride = side.row_bytes(hd);
  for (size_t r = 0; r < n; ++r) {
    std::copy_n(rows + r * size_t(hd), size_t(hd), row.data());
    if (rot) rot->apply(row.data(), 1);
    kv_encode(side, row.data(), hd, out + r * stride);
  }
}

void sigmoid_gate(float* out, const float* gate, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] *= sigmoid(gate[i]);
}

void deltanet_prepare(const DeltaNetPrep& a) {
  const size_t tokens = size_t(a.T), key_dim = size_t(a.nk) * size_t(a.dk), value_dim = size_t(a.nv) * size_t(a.dv);
  const size_t conv_dim = 2 * key_dim + value_dim;
  std::vector<float> qkv(tokens * conv_dim), mixed(qkv.size()), b(tokens * size_t(a.nv)), gate_a(b.size());
  deltanet_split(a.qkvz, a.ba, a.T, a.nk, a.nv, a.dk, a.dv, qkv.data(), a.z, b.data(), gate_a.data());
  causal_conv1d_silu(qkv.data(), a.T, int(conv_dim), a.conv_w, a.conv_k, a.conv_state, mixed.data());
  // The conv's output [T][q, k, v] split, q and k L2-normalised per head, q then scaled.
  copy_rows(a.q, key_dim, mixed.data(), conv_dim, key_dim, tokens);
  copy_rows(a.k, key_dim, mixed.data() + key_dim, conv_dim, key_dim, tokens);
  copy_rows(a.v, value_dim, mixed.data() + 2 * key_dim, conv_dim, value_dim, tokens);
  l2norm_heads(a.q, a.T * a.nk, a.dk, a.eps);
  l2norm_heads(a.k, a.T * a.nk, a.dk, a.eps);
  for (size_t i = 0; i < tokens * key_dim; ++i) a.q[i] *= a.q_scale;
  deltanet_gates(b.data(), gate_a.data(), a.A, a.dt_bias, a.T, a.nv, a.g, a.beta);
}

void shared_gate_add(float* out, const float* s, const float* x, const Mat& gate, int T, int H) {
  std::vector<float> g(static_cast<size_t>(T));
  matmul(x, T, gate, g.data());
  for (int t = 0; t < T; ++t) {
    const float w = sigmoid(g[size_t(t)]);
    for (int h = 0; h < H; ++h) out[size_t(t) * size_t(H) + size_t(h)] += w * s[size_t(t) * size_t(H) + size_t(h)];
  }
}

void gather_users(const ExpertUsers& g, int e, const float* x, int H, float* xb) {
  const auto& u = g.users[size_t(e)];
  for (size_t j = 0; j < u.size(); ++j) std::copy_n(x + size_t(u[j] / g.K) * size_t(H), H, xb + j * size_t(H));
}

void scatter_users(const ExpertUsers& g, int e, const float* yb, int H, float* partial) {
  const auto& u = g.users[size_t(e)];
  for (size_t j = 0; j < u.size(); ++j) {
    const float wt = g.weights[size_t(u[j])];
    float* dst = partial + size_t(u[j]) * size_t(H);
    for (int h = 0; h < H; ++h) dst[h] = wt * yb[j * size_t(H) + size_t(h)];
  }
}

void sum_slots(const float* partial, int T, int K, int H, float* out) {
  for (int t = 0; t < T; ++t) {
    float* o = out + size_t(t) * size_t(H);
    std::fill(o, o + H, 0.f);
    for (int k = 0; k < K; ++k) {
      const float* p = partial + (size_t(t) * size_t(K) + size_t(k)) * size_t(H);
      for (int h = 0; h < H; ++h) o[h] += p[h];
    }
  }
}

}  // namespace ms::cpu
