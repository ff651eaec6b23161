#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/deltanet.h"
#include "kernels/cpu/ops.h"
#include "model/blocks.h"

namespace ms {

namespace {

float softplus(float v) { return v > 20.f ? v : std::log1p(std::exp(v)); }  // torch's threshold

// The public checkpoints group in_proj_qkvz by key head: [q(dk), k(dk), v(r·dv), z(r·dv)] for
// each of the nk key heads (r = value heads per key head), and in_proj_ba as [b(r), a(r)].
// Regroup into the conv's channel order (all q, all k, all v) and separate z, b, a.
struct Projections {
  std::vector<float> qkv, z, b, a;
};

Projections split_projections(const ModelConfig& cfg, const float* qkvz, const float* ba, int T) {
  const int nk = cfg.lin_k_heads, nv = cfg.lin_v_heads, dk = cfg.lin_k_dim, dv = cfg.lin_v_dim, r = nv / nk;
  const size_t key_dim = size_t(nk) * size_t(dk), value_dim = size_t(nv) * size_t(dv);
  const size_t conv_dim = 2 * key_dim + value_dim, group = size_t(2 * dk + 2 * r * dv);
  Projections p{std::vector<float>(size_t(T) * conv_dim), std::vector<float>(size_t(T) * value_dim),
                std::vector<float>(size_t(T) * size_t(nv)), std::vector<float>(size_t(T) * size_t(nv))};
  for (size_t t = 0; t < size_t(T); ++t) {
    float* qkv = p.qkv.data() + t * conv_dim;
    for (size_t h = 0; h < size_t(nk); ++h) {
      const float* src = qkvz + t * size_t(nk) * group + h * group;
      const size_t vw = size_t(r) * size_t(dv);
      std::copy_n(src, dk, qkv + h * size_t(dk));
      std::copy_n(src + dk, dk, qkv + key_dim + h * size_t(dk));
      std::copy_n(src + 2 * dk, vw, qkv + 2 * key_dim + h * vw);
      std::copy_n(src + 2 * dk + vw, vw, p.z.data() + t * value_dim + h * vw);
      const float* bsrc = ba + t * 2 * size_t(nv) + h * 2 * size_t(r);
      std::copy_n(bsrc, r, p.b.data() + t * size_t(nv) + h * size_t(r));
      std::copy_n(bsrc + r, r, p.a.data() + t * size_t(nv) + h * size_t(r));
    }
  }
  return p;
}

}  // namespace

void deltanet_block(const ModelConfig& cfg, const DeltaNetWeights& w, const float* x, int T, LinearState& state,
                    float* out) {
  const int nk = cfg.lin_k_heads, nv = cfg.lin_v_heads, dk = cfg.lin_k_dim, dv = cfg.lin_v_dim;
  const size_t key_dim = size_t(nk) * size_t(dk), value_dim = size_t(nv) * size_t(dv);
  const int conv_dim = int(2 * key_dim + value_dim);

  std::vector<float> qkvz(size_t(T) * size_t(w.in_proj_qkvz.rows)), ba(size_t(T) * size_t(w.in_proj_ba.rows));
  cpu::matmul(x, T, w.in_proj_qkvz, qkvz.data());
  cpu::matmul(x, T, w.in_proj_ba, ba.data());
  Projections p = split_projections(cfg, qkvz.data(), ba.data(), T);

  std::vector<float> mixed(p.qkv.size());
  cpu::causal_conv1d_silu(p.qkv.data(), T, conv_dim, w.conv1d.data(), cfg.conv_kernel, state.conv.data(), mixed.data());

  std::vector<float> q(size_t(T) * key_dim), k(size_t(T) * key_dim), v(size_t(T) * value_dim);
  for (size_t t = 0; t < size_t(T); ++t) {
    const float* row = mixed.data() + t * size_t(conv_dim);
    std::copy_n(row, key_dim, q.data() + t * key_dim);
    std::copy_n(row + key_dim, key_dim, k.data() + t * key_dim);
    std::copy_n(row + 2 * key_dim, value_dim, v.data() + t * value_dim);
  }
  cpu::l2norm_heads(q.data(), T * nk, dk, 1e-6f);
  cpu::l2norm_heads(k.data(), T * nk, dk, 1e-6f);
  const float scale = 1.0f / std::sqrt(float(dk));
  for (auto& e : q) e *= scale;

  std::vector<float> g(size_t(T) * size_t(nv)), beta(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const size_t h = i % size_t(nv);
    beta[i] = 1.0f / (1.0f + std::exp(-p.b[i]));
    g[i] = -std::exp(w.A_log[h]) * softplus(p.a[i] + w.dt_bias[h]);
  }

  std::vector<float> o(size_t(T) * value_dim);
  cpu::gated_delta_rule(q.data(), k.data(), v.data(), g.data(), beta.data(), T, nk, nv, dk, dv, state.recurrent.data(),
                        o.data());
  cpu::rmsnorm_gated(o.data(), p.z.data(), w.norm.data(), T * nv, dv, cfg.rms_eps, o.data());
  cpu::matmul(o.data(), T, w.out_proj, out);
}

}  // namespace ms
