// Gated DeltaNet kernels. The hot loops are compiled once per SIMD target by Highway's
// foreach_target and picked at run time: plain C++ that the compiler vectorises for each target,
// except the matmul tile, written with Highway ops. The references stay scalar and obvious.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/deltanet.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// Highway's vector exp; after foreach_target so that it is compiled for each target.
#include <hwy/contrib/math/math-inl.h>

#include "kernels/cpu/matmul_tile-inl.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/deltanet.h"
#include "util/error.h"
#include "util/thread_pool.h"

#ifndef MS_DELTANET_SHARED_ONCE
#define MS_DELTANET_SHARED_ONCE
namespace ms::cpu::deltanet_detail {

constexpr int kChunk = 64;  // tokens per chunk of the chunked delta rule (HF's chunk_size)

// Value heads share key heads in groups (HF repeat_interleave): value head h reads key head h / group.
inline int key_head_group(int n_k_heads, int n_v_heads) {
  if (n_k_heads <= 0 || n_v_heads <= 0 || n_v_heads % n_k_heads != 0)
    fail("gated_delta_rule: n_v_heads {} is not a positive multiple of n_k_heads {}", n_v_heads, n_k_heads);
  return n_v_heads / n_k_heads;
}

}  // namespace ms::cpu::deltanet_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace ms::cpu::HWY_NAMESPACE {
using namespace ms::cpu::deltanet_detail;

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// silu(x) = x * sigmoid(x), from e = exp(-|x|) <= 1 so that nothing overflows:
// sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0.
hn::Vec<DF> Silu(DF d, hn::Vec<DF> x) {
  const auto e = hn::Exp(d, hn::Neg(hn::Abs(x)));
  const auto r = hn::Div(hn::Set(d, 1.0f), hn::Add(hn::Set(d, 1.0f), e));
  return hn::Mul(x, hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Mul(e, r), r));
}

// out[i] = silu(in[i]); the tail goes through the same vector code (padded), so a value's
// result does not depend on where in a row it sits. in may equal out.
void SiluRow(const float* in, float* out, size_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(Silu(d, hn::LoadU(d, in + i)), d, out + i);
  if (i < n) {
    HWY_ALIGN float pad[HWY_LANES(float)] = {};
    std::copy(in + i, in + n, pad);
    hn::Store(Silu(d, hn::Load(d, pad)), d, pad);
    std::copy_n(pad, n - i, out + i);
  }
}

// One chunk's working set for one value head (C = kChunk rows at most, n rows used).
struct ChunkScratch {
  ChunkScratch(int dk, int dv)
      : q(size_t(kChunk) * dk), k(size_t(kChunk) * dk), kt(size_t(dk) * kChunk), kk(size_t(kChunk) * kChunk),
        qk(size_t(kChunk) * kChunk), tinv(size_t(kChunk) * kChunk), rhs(size_t(kChunk) * (dv + dk)),
        uw(size_t(kChunk) * (dv + dk)), G(kChunk), gamma(kChunk) {}
  std::vector<float> q, k, kt;  // the chunk's q and k rows, and k transposed [dk, C]
  std::vector<float> kk, qk;    // k_r·k_s and q_r·k_s, [C, C]
  std::vector<float> tinv;      // (I + A)^-1, unit lower triangular [C, C]
  std::vector<float> rhs, uw;   // [beta v | beta gamma k] and T times it: [U | W], rows of dv + dk
  std::vector<double> G;        // cumulative log-decay within the chunk
  std::vector<float> gamma;     // exp(G)
};

// Tokens [t0, t0 + n) of value head h: with S the state before the chunk, G_r the cumulative
// log-decay up to row r and gamma_r = exp(G_r), unrolling the recurrence gives
//   S_r = gamma_r S + sum_{s<=r} exp(G_r - G_s) k_s u_s^T,
//   u_r = beta_r (v_r - gamma_r k_r^T S - sum_{s<r} exp(G_r - G_s) (k_r·k_s) u_s),
// i.e. (I + A) u = beta v - beta gamma K S with A[r,s] = beta_r exp(G_r - G_s) k_r·k_s (s < r).
// So u = U - W S with [U | W] = (I + A)^-1 [beta v | beta gamma k], and then
//   o_r = gamma_r q_r^T S + sum_{s<=r} exp(G_r - G_s) (q_r·k_s) u_s,
//   S' = gamma_{n-1} S + sum_s exp(G_{n-1} - G_s) k_s u_s^T.
// Every exponent is <= 0, so nothing overflows; G is summed in double so that exp(G_r - G_s) stays
// accurate when a large decay precedes small ones.
void DeltaChunk(const float* q, const float* k, const float* v, const float* g, const float* beta, int t0, int n,
                int h, int kh, int n_k_heads, int n_v_heads, int dk, int dv, float* S, float* out,
                ChunkScratch& w) {
  const int C = kChunk, W = dv + dk;
  for (int r = 0; r < n; ++r) {
    const size_t t = size_t(t0 + r);
    std::copy_n(q + (t * n_k_heads + kh) * dk, dk, &w.q[size_t(r) * dk]);
    std::copy_n(k + (t * n_k_heads + kh) * dk, dk, &w.k[size_t(r) * dk]);
    for (int i = 0; i < dk; ++i) w.kt[size_t(i) * C + r] = w.k[size_t(r) * dk + i];
    w.G[r] = (r ? w.G[r - 1] : 0.0) + double(g[t * n_v_heads + h]);
    w.gamma[r] = float(std::exp(w.G[r]));
  }

  // k_r·k_s and q_r·k_s for all r, s (the upper triangles are computed but never read).
  std::fill_n(w.kk.begin(), size_t(n) * C, 0.0f);
  std::fill_n(w.qk.begin(), size_t(n) * C, 0.0f);
  Matmul(w.k.data(), dk, 1, w.kt.data(), C, w.kk.data(), C, n, dk, n, 1.0f, false);
  Matmul(w.q.data(), dk, 1, w.kt.data(), C, w.qk.data(), C, n, dk, n, 1.0f, false);

  // qk becomes the decayed causal score matrix; tinv = (I + A)^-1 row by row:
  // T[r] = e_r - sum_{p<r} A[r,p] T[p].
  for (int r = 0; r < n; ++r) {
    const float b = beta[size_t(t0 + r) * n_v_heads + h];
    float* qk_r = &w.qk[size_t(r) * C];
    float* t_r = &w.tinv[size_t(r) * C];
    std::fill_n(t_r, C, 0.0f);
    t_r[r] = 1.0f;
    for (int p = 0; p < r; ++p) {
      const float decay = std::exp(float(w.G[r] - w.G[p]));
      qk_r[p] *= decay;
      const float a = b * decay * w.kk[size_t(r) * C + p];
      const float* t_p = &w.tinv[size_t(p) * C];
      for (int s = 0; s <= p; ++s) t_r[s] -= a * t_p[s];
    }
    std::fill(qk_r + r + 1, qk_r + C, 0.0f);

    // rhs row r = [beta v_r | beta gamma_r k_r]
    const float gamma = w.gamma[r];
    const float* v_r = v + (size_t(t0 + r) * n_v_heads + h) * dv;
    float* rhs_r = &w.rhs[size_t(r) * W];
    for (int j = 0; j < dv; ++j) rhs_r[j] = b * v_r[j];
    for (int i = 0; i < dk; ++i) rhs_r[dv + i] = b * gamma * w.k[size_t(r) * dk + i];
  }

  // [U | W] = T [beta v | beta gamma k]; then u = U - W S in place of U.
  std::fill_n(w.uw.begin(), size_t(n) * W, 0.0f);
  Matmul(w.tinv.data(), C, 1, w.rhs.data(), W, w.uw.data(), W, n, n, W, 1.0f, true);
  Matmul(w.uw.data() + dv, W, 1, S, dv, w.uw.data(), W, n, dk, dv, -1.0f, false);

  // o = (gamma q) S + (decayed causal q k^T) u, written straight into out's rows of this head.
  const size_t ldo = size_t(n_v_heads) * dv;
  float* o = out + (size_t(t0) * n_v_heads + h) * dv;
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < dk; ++i) w.q[size_t(r) * dk + i] *= w.gamma[r];
    std::fill_n(o + r * ldo, dv, 0.0f);
  }
  Matmul(w.q.data(), dk, 1, S, dv, o, ldo, n, dk, dv, 1.0f, false);
  Matmul(w.qk.data(), C, 1, w.uw.data(), W, o, ldo, n, n, dv, 1.0f, true);

  // S' = gamma_last S + (k decayed to the chunk's end)^T u; k is reused for the decayed rows.
  const double G_last = w.G[n - 1];
  for (int r = 0; r < n; ++r) {
    const float decay = float(std::exp(G_last - w.G[r]));
    for (int i = 0; i < dk; ++i) w.k[size_t(r) * dk + i] *= decay;
  }
  const float gamma_last = w.gamma[n - 1];
  for (size_t e = 0; e < size_t(dk) * dv; ++e) S[e] *= gamma_last;
  Matmul(w.k.data(), 1, dk, w.uw.data(), W, S, dv, dk, n, dv, 1.0f, false);
}

// One token of value head h, the recurrence fused into two passes over the state.
void DeltaStep(const float* q, const float* k, const float* v, float g, float beta, int dk, int dv, float* S,
               float* o, float* kv) {
  const float decay = std::exp(g);
  std::fill_n(kv, dv, 0.0f);
  for (int i = 0; i < dk; ++i) {
    float* s = S + size_t(i) * dv;
    for (int j = 0; j < dv; ++j) {
      s[j] *= decay;
      kv[j] += k[i] * s[j];
    }
  }
  for (int j = 0; j < dv; ++j) kv[j] = (v[j] - kv[j]) * beta;  // kv now holds delta
  std::fill_n(o, dv, 0.0f);
  for (int i = 0; i < dk; ++i) {
    float* s = S + size_t(i) * dv;
    for (int j = 0; j < dv; ++j) {
      s[j] += k[i] * kv[j];
      o[j] += q[i] * s[j];
    }
  }
}

// Value heads [h0, h1) over all T tokens.
void DeltaHeads(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out, int h0, int h1) {
  const int group = n_v_heads / n_k_heads;
  if (T == 1) {
    std::vector<float> kv(static_cast<size_t>(dv));
    for (int h = h0; h < h1; ++h) {
      const int kh = h / group;
      DeltaStep(q + size_t(kh) * dk, k + size_t(kh) * dk, v + size_t(h) * dv, g[h], beta[h], dk, dv,
                state + size_t(h) * dk * dv, out + size_t(h) * dv, kv.data());
    }
    return;
  }
  ChunkScratch scratch(dk, dv);
  for (int h = h0; h < h1; ++h)
    for (int t0 = 0; t0 < T; t0 += kChunk)
      DeltaChunk(q, k, v, g, beta, t0, std::min(kChunk, T - t0), h, h / group, n_k_heads, n_v_heads, dk, dv,
                 state + size_t(h) * dk * dv, out, scratch);
}

// Channels [c0, c1) of the causal conv.
void ConvChannels(const float* x, int T, int C, const float* w, int K, float* state, float* out, int c0, int c1) {
  const int nc = c1 - c0, H = K - 1;
  // The state's columns as rows (prev[j][c]) and w transposed, so that every inner loop runs over
  // contiguous channels.
  std::vector<float> prev(size_t(H) * nc), wt(size_t(K) * nc);
  for (int c = 0; c < nc; ++c) {
    for (int j = 0; j < H; ++j) prev[size_t(j) * nc + c] = state[size_t(c0 + c) * H + j];
    for (int j = 0; j < K; ++j) wt[size_t(j) * nc + c] = w[size_t(c0 + c) * K + j];
  }
  // Row u of xx = state ++ x, restricted to the channel range.
  auto row = [&](int u) { return u < H ? &prev[size_t(u) * nc] : x + size_t(u - H) * C + c0; };
  std::vector<float> acc(static_cast<size_t>(nc));
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int j = 0; j < K; ++j) {
      const float* xr = row(t + j);
      const float* wr = &wt[size_t(j) * nc];
      for (int c = 0; c < nc; ++c) acc[size_t(c)] += wr[c] * xr[c];
    }
    SiluRow(acc.data(), out + size_t(t) * C + c0, size_t(nc));
  }
  for (int j = 0; j < H; ++j) {
    const float* xr = row(T + j);
    for (int c = 0; c < nc; ++c) state[size_t(c0 + c) * H + j] = xr[c];
  }
}

// Rows [r0, r1) of rmsnorm_gated.
void RmsNormGatedRows(const float* x, const float* z, const float* w, int dim, float eps, float* out, size_t r0,
                      size_t r1) {
  for (size_t r = r0; r < r1; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(ss / dim + double(eps)));
    thread_local std::vector<float> gate;  // out may alias x: keep x intact until it is read
    gate.resize(size_t(dim));
    SiluRow(z + r * dim, gate.data(), size_t(dim));
    for (int i = 0; i < dim; ++i) o[i] = gate[size_t(i)] * (w[i] * (xr[i] * inv));
  }
}

}  // namespace ms::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ms::cpu {
using namespace deltanet_detail;

HWY_EXPORT(DeltaHeads);
HWY_EXPORT(ConvChannels);
HWY_EXPORT(RmsNormGatedRows);

void causal_conv1d_silu(const float* x, int T, int C, const float* w, int K, float* state, float* out) {
  if (K < 1) fail("causal_conv1d_silu: kernel size {} < 1", K);
  if (T <= 0 || C <= 0) return;
  // Channels are independent; hundreds per task keep the inner loops long. The grain does not
  // depend on T, so a channel's arithmetic is the same however a sequence is split into calls.
  ThreadPool::global().parallel_for(
      size_t(C),
      [&](size_t c0, size_t c1) {
        HWY_DYNAMIC_DISPATCH(ConvChannels)(x, T, C, w, K, state, out, int(c0), int(c1));
      },
      512);
}

void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                      int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out) {
  key_head_group(n_k_heads, n_v_heads);
  if (T <= 0) return;
  ThreadPool::global().parallel_for(size_t(n_v_heads), [&](size_t h0, size_t h1) {
    HWY_DYNAMIC_DISPATCH(DeltaHeads)(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state, out, int(h0),
                                     int(h1));
  });
}

void gated_delta_rule_reference(const float* q, const float* k, const float* v, const float* g,
                                const float* beta, int T, int n_k_heads, int n_v_heads, int dk, int dv,
                                float* state, float* out) {
  const int group = key_head_group(n_k_heads, n_v_heads);
  std::vector<float> kv(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv));
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < n_v_heads; ++h) {
      const float* q_t = q + (size_t(t) * n_k_heads + h / group) * dk;
      const float* k_t = k + (size_t(t) * n_k_heads + h / group) * dk;
      const float* v_t = v + (size_t(t) * n_v_heads + h) * dv;
      const float g_t = g[size_t(t) * n_v_heads + h], beta_t = beta[size_t(t) * n_v_heads + h];
      float* S = state + size_t(h) * dk * dv;
      float* o = out + (size_t(t) * n_v_heads + h) * dv;
      // S = S * exp(g)
      const float decay = std::exp(g_t);
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) S[i * dv + j] *= decay;
      // kv = k^T S; delta = (v - kv) * beta
      for (int j = 0; j < dv; ++j) {
        kv[j] = 0.0f;
        for (int i = 0; i < dk; ++i) kv[j] += k_t[i] * S[i * dv + j];
        delta[j] = (v_t[j] - kv[j]) * beta_t;
      }
      // S = S + k delta^T
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) S[i * dv + j] += k_t[i] * delta[j];
      // o = q^T S
      for (int j = 0; j < dv; ++j) {
        o[j] = 0.0f;
        for (int i = 0; i < dk; ++i) o[j] += q_t[i] * S[i * dv + j];
      }
    }
  }
}

namespace {
// Rows of a norm per task: enough work to be worth a hand-off.
size_t norm_grain(int dim) { return std::max<size_t>(1, 16384 / size_t(std::max(1, dim))); }
}  // namespace

void l2norm_heads(float* x, int rows, int dim, float eps) {
  ThreadPool::global().parallel_for(
      size_t(std::max(0, rows)),
      [&](size_t r0, size_t r1) {
        for (size_t r = r0; r < r1; ++r) {
          float* xr = x + r * dim;
          double ss = 0.0;
          for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
          const float inv = float(1.0 / std::sqrt(ss + double(eps)));
          for (int i = 0; i < dim; ++i) xr[i] *= inv;
        }
      },
      norm_grain(dim));
}

void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out) {
  ThreadPool::global().parallel_for(
      size_t(std::max(0, rows)),
      [&](size_t r0, size_t r1) { HWY_DYNAMIC_DISPATCH(RmsNormGatedRows)(x, z, w, dim, eps, out, r0, r1); },
      norm_grain(dim));
}

}  // namespace ms::cpu
#endif
