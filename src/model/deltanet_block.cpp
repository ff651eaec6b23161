#include <algorithm>
#include <cmath>

#include "model/backend_cpu.h"
#include "model/backend_cuda.h"
#include "model/blocks.h"

namespace ms {

namespace {
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

void deltanet_gates(const float* b, const float* a, const float* A_log, const float* dt_bias, int T, int nv, float* g,
                    float* beta) {
  for (size_t i = 0; i < size_t(T) * size_t(nv); ++i) {
    const size_t h = i % size_t(nv);
    beta[i] = cpu::sigmoid(b[i]);
    g[i] = -std::exp(A_log[h]) * softplus(a[i] + dt_bias[h]);
  }
}

}  // namespace

void CpuBackend::deltanet_prepare(const float* qkvz, const float* ba, int T, int nk, int nv, int dk, int dv,
                                  const float* conv_w, int conv_k, float* conv_state, const float* A_log,
                                  const float* dt_bias, float eps, float q_scale, float* q, float* k, float* v,
                                  float* z, float* g, float* beta) const {
  const size_t tokens = size_t(T), key_dim = size_t(nk) * size_t(dk), value_dim = size_t(nv) * size_t(dv);
  const size_t conv_dim = 2 * key_dim + value_dim;
  Buf qkv(tokens * conv_dim), mixed(qkv.size()), b(tokens * size_t(nv)), a(b.size());
  deltanet_split(qkvz, ba, T, nk, nv, dk, dv, qkv.data(), z, b.data(), a.data());
  cpu::causal_conv1d_silu(qkv.data(), T, int(conv_dim), conv_w, conv_k, conv_state, mixed.data());
  // The conv's output [T][q, k, v] split, q and k L2-normalised per head, q then scaled.
  copy_rows(q, key_dim, mixed.data(), conv_dim, key_dim, tokens);
  copy_rows(k, key_dim, mixed.data() + key_dim, conv_dim, key_dim, tokens);
  copy_rows(v, value_dim, mixed.data() + 2 * key_dim, conv_dim, value_dim, tokens);
  cpu::l2norm_heads(q, T * nk, dk, eps);
  cpu::l2norm_heads(k, T * nk, dk, eps);
  for (size_t i = 0; i < tokens * key_dim; ++i) q[i] *= q_scale;
  deltanet_gates(b.data(), a.data(), A_log, dt_bias, T, nv, g, beta);
}

template <class B>
void deltanet_block(const B& be, const ModelConfig& cfg, const DeltaNetWeights& w, const float* x, int T,
                    typename B::Linear& state, float* out) {
  const int nk = cfg.lin_k_heads, nv = cfg.lin_v_heads, dk = cfg.lin_k_dim, dv = cfg.lin_v_dim;
  const size_t key_dim = size_t(nk) * size_t(dk), value_dim = size_t(nv) * size_t(dv);
  const size_t tokens = size_t(T);

  typename B::Buf proj = be.alloc(tokens * size_t(w.in_proj_qkvz.rows + w.in_proj_ba.rows));
  be.matmul_stack(x, T, {&w.in_proj_qkvz, &w.in_proj_ba}, proj.data());
  const float* qkvz = proj.data();
  const float* ba = qkvz + tokens * size_t(w.in_proj_qkvz.rows);

  typename B::Buf q = be.alloc(tokens * key_dim), k = be.alloc(tokens * key_dim), v = be.alloc(tokens * value_dim),
                  z = be.alloc(tokens * value_dim), g = be.alloc(tokens * size_t(nv)), beta = be.alloc(tokens * size_t(nv));
  be.deltanet_prepare(qkvz, ba, T, nk, nv, dk, dv, be.vec(w.conv1d), cfg.conv_kernel, state.conv.data(),
                      be.vec(w.A_log), be.vec(w.dt_bias), 1e-6f, 1.0f / std::sqrt(float(dk)), q.data(), k.data(),
                      v.data(), z.data(), g.data(), beta.data());

  typename B::Buf o = be.alloc(tokens * value_dim);
  be.gated_delta_rule(q.data(), k.data(), v.data(), g.data(), beta.data(), T, nk, nv, dk, dv, state.recurrent.data(),
                      o.data());
  be.rmsnorm_gated(o.data(), z.data(), be.vec(w.norm), T * nv, dv, cfg.rms_eps, o.data());
  be.matmul(o.data(), T, be.mat(w.out_proj), out);
}

template void deltanet_block(const CpuBackend&, const ModelConfig&, const DeltaNetWeights&, const float*, int,
                             LinearState&, float*);
#if MOESTREAM_CUDA
template void deltanet_block(const CudaBackend&, const ModelConfig&, const DeltaNetWeights&, const float*, int,
                             DeviceLinear&, float*);
#endif

}  // namespace ms
