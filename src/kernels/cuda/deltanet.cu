// Gated DeltaNet kernels: the rule's inputs from the projections (the causal conv1d + SiLU with its
// carried state, the norms and the gates), and the gated delta rule, run as its recurrence token
// by token for short T and in the chunked form for prefill.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/deltanet.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

constexpr int kInputThreads = 128;  // channels a block of deltanet_prepare converts at once
constexpr int kInputTokens = 16;    // tokens a block of it takes (at least the conv's K - 1)

// One conv channel's outputs of tokens [t0, t1): out[t] = silu(Σ_j w[j]·xx(t + j)), xx = state ++
// x (token u of x at x[u·stride]). The block of the first tokens (t0 = 0), the only one that reads
// the state (t1 >= K - 1), then leaves it as the last K - 1 inputs, written oldest first so that
// no unread value is overwritten.
__device__ void conv_channel(const float* x, size_t stride, const float* w, int K, float* st, int t0, int t1, int T,
                             float* out, size_t out_stride) {
  const int H = K - 1;
  auto xx = [&](int u) { return u < H ? st[u] : x[size_t(u - H) * stride]; };
  for (int t = t0; t < t1; ++t) {
    float acc = 0.f;
    for (int j = 0; j < K; ++j) acc += w[j] * xx(t + j);
    out[size_t(t) * out_stride] = silu(acc);
  }
  if (t0 == 0)
    for (int j = 0; j < H; ++j) st[j] = xx(T + j);
}

// Block (h, part, tokens from blockIdx.z · tokens_per_block) of key head h's group of qkvz,
// [q(dk), k(dk), v(r·dv), z(r·dv)] (channel i of the group is the conv's channel h·dk + i of q,
// nk·dk + h·dk + i − dk of k, 2·nk·dk + h·r·dv + i − 2·dk of v): part 0 the q head, through the
// conv and L2-normalised per token, then scaled, and the gates of the r value heads; part 1 the k
// head, as q unscaled; parts 2.. kInputThreads channels of v each, through the conv, and those of z.
__global__ void __launch_bounds__(kInputThreads) deltanet_prepare_kernel(const DeltaNetPrep a, int tokens_per_block) {
  start_after_kernel_before();  // launched by launch_after
  const int h = blockIdx.x, part = blockIdx.y, t0 = int(blockIdx.z) * tokens_per_block;
  const int t1 = min(a.T, t0 + tokens_per_block), dk = a.dk, r = a.nv / a.nk, vw = r * a.dv;
  const size_t key_dim = size_t(a.nk) * dk, value_dim = size_t(a.nv) * a.dv, row = size_t(a.nk) * (2 * dk + 2 * vw);
  const float* group = a.qkvz + size_t(h) * (2 * dk + 2 * vw);
  int i0 = 0, i1 = dk;  // the part's channels of the group
  size_t c0 = size_t(h) * dk, out_stride = key_dim;
  float* out = a.q + size_t(h) * dk;
  if (part == 1) {
    i0 = dk, i1 = 2 * dk, c0 = key_dim + size_t(h) * dk, out = a.k + size_t(h) * dk;
  } else if (part >= 2) {
    const int j0 = (part - 2) * kInputThreads;
    i0 = 2 * dk + j0, i1 = 2 * dk + min(vw, j0 + kInputThreads);
    c0 = 2 * key_dim + size_t(h) * vw + j0, out = a.v + size_t(h) * vw + j0, out_stride = value_dim;
  }
  const int K = a.conv_k;
  for (int i = i0 + int(threadIdx.x); i < i1; i += kInputThreads) {
    const size_t c = c0 + size_t(i - i0);
    conv_channel(group + i, row, a.conv_w + c * K, K, a.conv_state + c * (K - 1), t0, t1, a.T, out + (i - i0),
                 out_stride);
  }
  if (part >= 2) {
    const int j0 = i0 - 2 * dk, n = i1 - i0;
    for (int e = threadIdx.x; e < (t1 - t0) * n; e += kInputThreads) {
      const int t = t0 + e / n, j = j0 + e % n;
      a.z[size_t(t) * value_dim + size_t(h) * vw + j] = group[size_t(t) * row + 2 * dk + vw + j];
    }
    return;  // uniform over the block
  }
  if (part == 0) {
    for (int e = threadIdx.x; e < (t1 - t0) * r; e += kInputThreads) {
      const int t = t0 + e / r, j = e % r, hv = h * r + j;
      const float* bt = a.ba + size_t(t) * 2 * a.nv + size_t(h) * 2 * r;
      const float v = bt[r + j] + a.dt_bias[hv];
      const float softplus = v > 20.f ? v : log1pf(expf(v));
      a.beta[size_t(t) * a.nv + hv] = sigmoid(bt[j]);
      a.g[size_t(t) * a.nv + hv] = a.A[hv] * softplus;
    }
  }
  __syncthreads();  // the head's conv outputs, which the norms read, are in `out`
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int t = t0 + warp; t < t1; t += kInputThreads / 32) {
    float* v = out + size_t(t) * out_stride;
    double ss = 0.0;  // in double, as cpu::l2norm_heads
    for (int i = lane; i < dk; i += 32) ss += double(v[i]) * v[i];
    const float inv = float(1.0 / sqrt(warp_sum(ss) + double(a.eps)));
    for (int i = lane; i < dk; i += 32) v[i] = part == 0 ? v[i] * inv * a.q_scale : v[i] * inv;
  }
}

// The recurrence, one block per (value head, 32 state columns j): warp w of the block holds rows
// w, w + G, ... (G warps, R rows each) of those columns in registers for all T tokens, so that the
// state is read and written once a call, coalesced (a warp reads 32 consecutive columns of a row).
// Per token, in the reference's order: S *= exp(g); kv = kᵀS; delta = (v - kv)·beta; S += k deltaᵀ;
// o = qᵀS; the sums over rows are each warp's share, then the G shares added through shared memory.
constexpr int kRecCols = 32;

template <int R>
__global__ void __launch_bounds__(1024)
    delta_rule_kernel(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                      int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out) {
  start_after_kernel_before();  // launched by launch_after
  extern __shared__ float sm[];
  const int G = int(blockDim.x) / 32;
  float* qs = sm;                    // q_t [dk]
  float* ks = qs + dk;               // k_t [dk]
  float* kv_part = ks + dk;          // [G][32]: each warp's share of kᵀS
  float* o_part = kv_part + G * 32;  // [G][32]: of qᵀS
  const int h = blockIdx.x, kh = h / (n_v_heads / n_k_heads);
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int j = blockIdx.y * kRecCols + lane;
  const bool col_in = j < dv;
  float* S = state + size_t(h) * dk * dv + j;
  float s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = w + G * r;
    s[r] = col_in && i < dk ? S[size_t(i) * dv] : 0.f;
  }
  for (int t = 0; t < T; ++t) {
    const size_t qk_row = (size_t(t) * n_k_heads + kh) * dk, hv = size_t(t) * n_v_heads + h;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      qs[i] = q[qk_row + i];
      ks[i] = k[qk_row + i];
    }
    const float decay = expf(g[hv]), b = beta[hv];
    const float vj = col_in ? v[hv * dv + j] : 0.f;
    __syncthreads();  // q_t, k_t staged; the previous token's shares are read
    float kv = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int i = w + G * r;
      if (i < dk) {
        s[r] *= decay;
        kv = fmaf(ks[i], s[r], kv);
      }
    }
    kv_part[w * 32 + lane] = kv;
    __syncthreads();
    kv = 0.f;
    for (int p = 0; p < G; ++p) kv += kv_part[p * 32 + lane];  // every warp the same sum, in the same order
    const float delta = (vj - kv) * b;
    float o = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int i = w + G * r;
      if (i < dk) {
        s[r] = fmaf(ks[i], delta, s[r]);
        o = fmaf(qs[i], s[r], o);
      }
    }
    o_part[w * 32 + lane] = o;
    __syncthreads();  // also: q_t, k_t and kv_part are read, the next token may replace them
    if (w == 0 && col_in) {
      o = 0.f;
      for (int p = 0; p < G; ++p) o += o_part[p * 32 + lane];
      out[hv * dv + j] = o;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = w + G * r;
    if (col_in && i < dk) S[size_t(i) * dv] = s[r];
  }
}

template <int R>
void launch_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                       int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out) {
  const int warps = (dk + R - 1) / R;
  const dim3 grid(unsigned(n_v_heads), unsigned((dv + kRecCols - 1) / kRecCols));
  const size_t smem = sizeof(float) * (2 * size_t(dk) + 2 * size_t(warps) * 32);
  launch_after(delta_rule_kernel<R>, grid, 32 * warps, smem, q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state, out);
  CUDA_CHECK_LAUNCH();
}

// ---- The chunked form (kernels/cpu/deltanet.cpp's DeltaChunk, rearranged for the GPU) ----
// Per chunk of n <= 64 tokens of value head h, with S the state before it, G_r the cumulative
// log-decay, gamma_r = exp(G_r), A[r,s] = beta_r exp(G_r - G_s) k_r·k_s (s < r) and
// P[r,s] = exp(G_r - G_s) q_r·k_s (s <= r):
//   [U | W] = (I + A)^-1 [beta v | beta gamma k],  u = U - W S,
//   o = gamma q S + P u = Q' S + O'  with  Q' = gamma q - P W,  O' = P U,
//   S' = gamma_{n-1} S + sum_r exp(G_{n-1} - G_r) k_r u_r^T.
// U, W, Q', O' depend on the chunk's inputs only: chunk_prepare_kernel makes them for every
// (chunk, head) at once. What is left runs chunk after chunk: chunk_state_kernel, one block per
// (head, 32 state columns), as each column of S evolves on its own.
constexpr int kChunk = 64;           // tokens a chunk, as the CPU kernel
constexpr int kPrepThreads = 256;    // chunk_prepare_kernel's block
constexpr int kStateCols = 32;       // state columns of a chunk_state_kernel block
constexpr int kStateThreads = 256;   // 32 row groups x 8 column quads
constexpr size_t kScratchBudget = size_t(64) << 20;  // bytes of per-chunk products held at once

// What chunk_prepare_kernel leaves for chunk_state_kernel, per (chunk of the slab, value head)
// ch = chunk * n_v_heads + head; rows past the chunk's n tokens are not written.
struct ChunkProducts {
  float* wq;     // [ch][2 * kChunk][dk]: the rows of W, then the rows of Q'
  float* u;      // [ch][kChunk][dv]: U
  float* kdec;   // [ch][kChunk]: exp(G_{n-1} - G_r)
  float* glast;  // [ch]: gamma_{n-1}
};

// One block per (chunk of the slab, value head). O' goes straight into out's rows, where
// chunk_state_kernel adds Q' S to it.
__global__ void __launch_bounds__(kPrepThreads)
    chunk_prepare_kernel(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                         int t_begin, int n_k_heads, int n_v_heads, int dk, int dv, ChunkProducts cp, float* out) {
  constexpr int C = kChunk, LD = 33;  // LD: the k, q slices' row stride, off the bank period
  __shared__ __align__(16) float mats[2 * C * C];  // k, q slices for k·k and q·k; then A and P
  __shared__ double G[C];
  __shared__ float gs[C], gam[C], bet[C];
  const int h = blockIdx.y, kh = h / (n_v_heads / n_k_heads), tid = threadIdx.x;
  const int t0 = t_begin + int(blockIdx.x) * C, n = min(C, T - t0);
  const size_t ch = size_t(blockIdx.x) * n_v_heads + h;

  if (tid < C) {
    gs[tid] = tid < n ? g[size_t(t0 + tid) * n_v_heads + h] : 0.f;
    bet[tid] = tid < n ? beta[size_t(t0 + tid) * n_v_heads + h] : 0.f;
  }
  __syncthreads();
  // G in double, as the CPU kernel, so that exp(G_r - G_s) stays accurate after a large decay.
  if (tid == 0) {
    double acc = 0.0;
    for (int r = 0; r < n; ++r) G[r] = acc += double(gs[r]);
  }
  __syncthreads();
  if (tid < C) {
    const int r = tid;
    gam[r] = r < n ? float(exp(G[r])) : 0.f;
    cp.kdec[ch * C + r] = r < n ? float(exp(G[n - 1] - G[r])) : 0.f;
    if (r == 0) cp.glast[ch] = float(exp(G[n - 1]));
  }

  // k_r·k_s and q_r·k_s over slices of 32 dims; this thread's rows ty + 16i, columns tx + 16j.
  const int ty = tid / 16, tx = tid % 16;
  float kk[4][4] = {}, qk[4][4] = {};
  const size_t kq_stride = size_t(n_k_heads) * dk;
  const float* k0 = k + (size_t(t0) * n_k_heads + kh) * dk;
  const float* q0 = q + (size_t(t0) * n_k_heads + kh) * dk;
  float* Ks = mats;
  float* Qs = mats + C * LD;
  for (int d0 = 0; d0 < dk; d0 += 32) {
    __syncthreads();
    for (int e = tid; e < C * 32; e += kPrepThreads) {
      const int r = e / 32, d = e % 32;
      const bool in = r < n && d0 + d < dk;
      Ks[r * LD + d] = in ? k0[r * kq_stride + d0 + d] : 0.f;
      Qs[r * LD + d] = in ? q0[r * kq_stride + d0 + d] : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int d = 0; d < 32; ++d) {
      float kr[4], qr[4], ks[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        kr[i] = Ks[(ty + 16 * i) * LD + d];
        qr[i] = Qs[(ty + 16 * i) * LD + d];
        ks[i] = Ks[(tx + 16 * i) * LD + d];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          kk[i][j] = fmaf(kr[i], ks[j], kk[i][j]);
          qk[i][j] = fmaf(qr[i], ks[j], qk[i][j]);
        }
    }
  }
  __syncthreads();

  // A (strictly lower) and P (lower, diagonal included); zero rows past n.
  float* As = mats;
  float* Ps = mats + C * C;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = ty + 16 * i, s = tx + 16 * j;
      const float decay = s <= r && r < n ? expf(float(G[r] - G[s])) : 0.f;
      As[r * C + s] = s < r ? bet[r] * decay * kk[i][j] : 0.f;
      Ps[r * C + s] = decay * qk[i][j];
    }
  __syncthreads();

  // One column of [beta v | beta gamma k] a thread: forward substitution through (I + A), then
  // P times the solution. The column lives in registers (the loops unroll fully).
  for (int c = tid; c < dv + dk; c += kPrepThreads) {
    const bool is_v = c < dv;
    float x[C];
#pragma unroll
    for (int r = 0; r < C; ++r) {
      float rhs = 0.f;
      if (r < n)
        rhs = is_v ? bet[r] * v[(size_t(t0 + r) * n_v_heads + h) * dv + c]
                   : bet[r] * gam[r] * k0[r * kq_stride + (c - dv)];
      x[r] = rhs;
    }
#pragma unroll
    for (int r = 1; r < C; ++r) {
      const float4* a = reinterpret_cast<const float4*>(As + r * C);
      float acc = x[r];
#pragma unroll
      for (int p4 = 0; p4 < (r + 3) / 4; ++p4) {
        const float4 w = a[p4];
        acc = fmaf(-w.x, x[4 * p4], acc);
        if (4 * p4 + 1 < r) acc = fmaf(-w.y, x[4 * p4 + 1], acc);
        if (4 * p4 + 2 < r) acc = fmaf(-w.z, x[4 * p4 + 2], acc);
        if (4 * p4 + 3 < r) acc = fmaf(-w.w, x[4 * p4 + 3], acc);
      }
      x[r] = acc;
    }
#pragma unroll
    for (int r = 0; r < C; ++r) {
      const float4* p = reinterpret_cast<const float4*>(Ps + r * C);
      float y = 0.f;
#pragma unroll
      for (int s4 = 0; s4 <= r / 4; ++s4) {
        const float4 w = p[s4];
        y = fmaf(w.x, x[4 * s4], y);
        if (4 * s4 + 1 <= r) y = fmaf(w.y, x[4 * s4 + 1], y);
        if (4 * s4 + 2 <= r) y = fmaf(w.z, x[4 * s4 + 2], y);
        if (4 * s4 + 3 <= r) y = fmaf(w.w, x[4 * s4 + 3], y);
      }
      if (r < n) {
        if (is_v) {
          cp.u[(ch * C + r) * dv + c] = x[r];
          out[(size_t(t0 + r) * n_v_heads + h) * dv + c] = y;
        } else {
          const int i = c - dv;
          cp.wq[(ch * 2 * C + r) * dk + i] = x[r];
          cp.wq[(ch * 2 * C + C + r) * dk + i] = gam[r] * q0[r * kq_stride + i] - y;
        }
      }
    }
  }
}

__device__ __forceinline__ void fma4(float4& acc, float a, const float4& b) {
  acc.x = fmaf(a, b.x, acc.x);
  acc.y = fmaf(a, b.y, acc.y);
  acc.z = fmaf(a, b.z, acc.z);
  acc.w = fmaf(a, b.w, acc.w);
}

// Shared memory of chunk_state_kernel: [W; Q'] rows (stride dk + 4, so that the four rows a warp
// reads at once fall in different banks), k rows, the state's columns, and u scaled by kdec.
size_t state_smem_bytes(int dk) {
  return sizeof(float) * (size_t(2 * kChunk) * (dk + 4) + size_t(kChunk) * dk + size_t(dk) * kStateCols +
                          size_t(kChunk) * kStateCols);
}

// Chunks [0, n_chunks) of the slab for value head blockIdx.x, state columns j0 + [0, 32): per
// chunk, [u | o - O'] = [W; Q'] S (one product), then S = gamma_{n-1} S + kᵀ (kdec u). The next
// chunk's [W; Q'] and k rows are copied in (cp.async) while this one's products run.
__global__ void __launch_bounds__(kStateThreads)
    chunk_state_kernel(const float* k, int T, int t_begin, int n_chunks, int n_k_heads, int n_v_heads, int dk,
                       int dv, ChunkProducts cp, float* state, float* out) {
  constexpr int C = kChunk, SC = kStateCols;
  extern __shared__ __align__(16) float sm[];
  const int ldw = dk + 4;
  float* WQs = sm;                 // [2C][ldw]
  float* Ks = WQs + 2 * C * ldw;   // [C][dk]
  float* Ss = Ks + C * dk;         // [dk][SC]
  float* Us = Ss + dk * SC;        // [C][SC]
  const int h = blockIdx.x, kh = h / (n_v_heads / n_k_heads), tid = threadIdx.x;
  const int tx = tid % 8, ty = tid / 8;  // column quad, row group
  const int col = int(blockIdx.y) * SC + 4 * tx;
  const bool col_in = col < dv;  // dv is a multiple of 4: a quad is all in or all out
  const int q4 = dk / 4;
  float* Sg = state + size_t(h) * dk * dv;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);

  for (int e = tid; e < dk * (SC / 4); e += kStateThreads) {
    const int i = e / (SC / 4), j = int(blockIdx.y) * SC + 4 * (e % (SC / 4));
    *reinterpret_cast<float4*>(Ss + i * SC + j - int(blockIdx.y) * SC) =
        j < dv ? *reinterpret_cast<const float4*>(Sg + size_t(i) * dv + j) : zero;
  }
  auto rows_of = [&](int cc) { return min(C, T - (t_begin + cc * C)); };
  auto load_wq = [&](int cc) {
    const int n = rows_of(cc);
    const float* src = cp.wq + (size_t(cc) * n_v_heads + h) * 2 * C * dk;
    for (int e = tid; e < 2 * C * q4; e += kStateThreads) {
      const int r = e / q4, i = 4 * (e % q4);
      if (r % C < n) __pipeline_memcpy_async(WQs + r * ldw + i, src + size_t(r) * dk + i, 16);
    }
    __pipeline_commit();
  };
  auto load_k = [&](int cc) {
    const int n = rows_of(cc), t0 = t_begin + cc * C;
    for (int e = tid; e < n * q4; e += kStateThreads) {
      const int r = e / q4, i = 4 * (e % q4);
      __pipeline_memcpy_async(Ks + r * dk + i, k + (size_t(t0 + r) * n_k_heads + kh) * dk + i, 16);
    }
    __pipeline_commit();
  };

  load_wq(0);
  load_k(0);
  for (int cc = 0; cc < n_chunks; ++cc) {
    const int t0 = t_begin + cc * C, n = rows_of(cc);
    const size_t ch = size_t(cc) * n_v_heads + h;
    // This thread's rows of U, O' and kdec, fetched before the product that they wait for.
    const float* Ug = cp.u + ch * C * dv;
    float4 U[2] = {zero, zero}, O[2] = {zero, zero};
    float dec[2] = {0.f, 0.f};
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const int r = ty + 32 * a;
      if (r < n && col_in) {
        U[a] = *reinterpret_cast<const float4*>(Ug + size_t(r) * dv + col);
        O[a] = *reinterpret_cast<const float4*>(out + (size_t(t0 + r) * n_v_heads + h) * dv + col);
        dec[a] = cp.kdec[ch * C + r];
      }
    }
    const float gl = cp.glast[ch];
    __pipeline_wait_prior(1);  // this chunk's [W; Q'] (its k rows may still be in flight)
    __syncthreads();

    // Rows ty + 32a of [W; Q'] S: a = 0, 1 are rows of u, a = 2, 3 rows of o.
    float4 acc[4] = {zero, zero, zero, zero};
    for (int i = 0; i < dk; i += 4) {
      float4 s[4];
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) s[ii] = *reinterpret_cast<const float4*>(Ss + (i + ii) * SC + 4 * tx);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const float4 w = *reinterpret_cast<const float4*>(WQs + (ty + 32 * a) * ldw + i);
        fma4(acc[a], w.x, s[0]);
        fma4(acc[a], w.y, s[1]);
        fma4(acc[a], w.z, s[2]);
        fma4(acc[a], w.w, s[3]);
      }
    }
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const int r = ty + 32 * a;
      const float d = dec[a];  // 0 past n or dv
      *reinterpret_cast<float4*>(Us + r * SC + 4 * tx) = make_float4(
          d * (U[a].x - acc[a].x), d * (U[a].y - acc[a].y), d * (U[a].z - acc[a].z), d * (U[a].w - acc[a].w));
      if (r < n && col_in)
        *reinterpret_cast<float4*>(out + (size_t(t0 + r) * n_v_heads + h) * dv + col) =
            make_float4(O[a].x + acc[a + 2].x, O[a].y + acc[a + 2].y, O[a].z + acc[a + 2].z, O[a].w + acc[a + 2].w);
    }
    __syncthreads();  // u is complete; [W; Q'] is read
    if (cc + 1 < n_chunks) load_wq(cc + 1);
    else __pipeline_commit();  // an empty group keeps the count of groups in flight the same
    __pipeline_wait_prior(1);  // this chunk's k rows
    __syncthreads();

    // S = gamma_{n-1} S + kᵀ (kdec u), rows 4ib.. of S a thread.
    for (int ib = ty; ib < q4; ib += kStateThreads / 8) {
      float4 s2[4] = {zero, zero, zero, zero};
      for (int r = 0; r < n; ++r) {
        const float4 kr = *reinterpret_cast<const float4*>(Ks + r * dk + 4 * ib);
        const float4 ur = *reinterpret_cast<const float4*>(Us + r * SC + 4 * tx);
        fma4(s2[0], kr.x, ur);
        fma4(s2[1], kr.y, ur);
        fma4(s2[2], kr.z, ur);
        fma4(s2[3], kr.w, ur);
      }
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) {
        float4* sp = reinterpret_cast<float4*>(Ss + (4 * ib + ii) * SC + 4 * tx);
        const float4 o = *sp;
        *sp = make_float4(fmaf(gl, o.x, s2[ii].x), fmaf(gl, o.y, s2[ii].y), fmaf(gl, o.z, s2[ii].z),
                          fmaf(gl, o.w, s2[ii].w));
      }
    }
    __syncthreads();  // S is updated; the k rows are read
    if (cc + 1 < n_chunks) load_k(cc + 1);
    else __pipeline_commit();
  }

  for (int e = tid; e < dk * (SC / 4); e += kStateThreads) {
    const int i = e / (SC / 4), jj = 4 * (e % (SC / 4)), j = int(blockIdx.y) * SC + jj;
    if (j < dv) *reinterpret_cast<float4*>(Sg + size_t(i) * dv + j) = *reinterpret_cast<const float4*>(Ss + i * SC + jj);
  }
}

void check_heads(int n_k_heads, int n_v_heads) {
  if (n_k_heads <= 0 || n_v_heads <= 0 || n_v_heads % n_k_heads != 0)
    arg_fail("cuda::gated_delta_rule: n_v_heads " + std::to_string(n_v_heads) +
             " is not a positive multiple of n_k_heads " + std::to_string(n_k_heads));
}

}  // namespace

void deltanet_prepare(const DeltaNetPrep& p) {
  if (p.conv_k < 1) arg_fail("cuda::deltanet_prepare: conv kernel size " + std::to_string(p.conv_k) + " < 1");
  if (p.nk <= 0 || p.nv % p.nk != 0 || p.dk <= 0 || p.dv <= 0)
    arg_fail("cuda::deltanet_prepare: " + std::to_string(p.nk) + " key heads, " + std::to_string(p.nv) +
             " value heads (a multiple of them), dk " + std::to_string(p.dk) + ", dv " + std::to_string(p.dv));
  if (p.T <= 0) return;
  const int tokens = std::max(kInputTokens, p.conv_k - 1), v_parts = (p.nv / p.nk * p.dv + kInputThreads - 1) / kInputThreads;
  const dim3 grid(unsigned(p.nk), unsigned(2 + v_parts), unsigned((p.T + tokens - 1) / tokens));
  launch_after(deltanet_prepare_kernel, grid, kInputThreads, 0, p, tokens);
  CUDA_CHECK_LAUNCH();
}

void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                int T, int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out) {
  check_heads(n_k_heads, n_v_heads);
  if (dk <= 0 || dk > 32 * 32 || dv <= 0)
    arg_fail("cuda::gated_delta_rule_recurrent: dk " + std::to_string(dk) + ", dv " + std::to_string(dv) +
             " (dk up to 1024 rows: 32 warps of 32 rows)");
  if (T <= 0) return;
  // Rows a thread holds: 8 for dk up to 256 (16 warps at dk = 128), else 32.
  if (dk <= 32 * 8)
    launch_delta_rule<8>(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state, out);
  else
    launch_delta_rule<32>(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state, out);
}

bool chunked_delta_rule_fits(const float* k, int dk, int dv, const float* state, const float* out) {
  return dk > 0 && dv > 0 && dk % 4 == 0 && dv % 4 == 0 && state_smem_bytes(dk) <= size_t(optin_smem()) &&
         aligned(k, 16) && aligned(state, 16) && aligned(out, 16);
}

void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              int T, int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out) {
  check_heads(n_k_heads, n_v_heads);
  if (!chunked_delta_rule_fits(k, dk, dv, state, out))
    arg_fail("cuda::gated_delta_rule_chunked: dk " + std::to_string(dk) + ", dv " + std::to_string(dv) +
             " (multiples of 4, dk up to the shared memory) or the alignment of k, state, out (16 bytes) do not fit");
  if (T <= 0) return;
  const size_t smem = state_smem_bytes(dk);
  static size_t smem_set = 0;
  // The products of one chunk of all heads; a slab is as many chunks as the scratch budget holds,
  // and the slabs run one after the other, the state carried from one to the next.
  const size_t per_chunk = size_t(n_v_heads) * (size_t(2 * kChunk) * dk + size_t(kChunk) * dv + kChunk + 1);
  const int n_chunks = (T + kChunk - 1) / kChunk;
  const int slab = int(std::clamp<size_t>(kScratchBudget / (per_chunk * sizeof(float)), 1, size_t(n_chunks)));
  static std::mutex mu;
  static DeviceArray<float> scratch;  // grown when needed; kernels queued on one stream use it in turn
  std::lock_guard<std::mutex> lock(mu);
  if (smem > smem_set) {
    CUDA_CHECK(cudaFuncSetAttribute(chunk_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    smem_set = smem;
  }
  const size_t floats = size_t(slab) * per_chunk;
  if (scratch.size() < floats) scratch = DeviceArray<float>(floats, DeviceAlloc::Now);  // frees the old one after the GPU is done with it
  float* base = scratch.data();
  const size_t heads_chunks = size_t(slab) * n_v_heads;
  const ChunkProducts cp{base, base + heads_chunks * 2 * kChunk * dk,
                         base + heads_chunks * (size_t(2 * kChunk) * dk + size_t(kChunk) * dv),
                         base + heads_chunks * (size_t(2 * kChunk) * dk + size_t(kChunk) * dv + kChunk)};
  for (int c0 = 0; c0 < n_chunks; c0 += slab) {
    const int nc = std::min(slab, n_chunks - c0);
    chunk_prepare_kernel<<<dim3(unsigned(nc), unsigned(n_v_heads)), kPrepThreads, 0, compute_stream()>>>(
        q, k, v, g, beta, T, c0 * kChunk, n_k_heads, n_v_heads, dk, dv, cp, out);
    CUDA_CHECK_LAUNCH();
    chunk_state_kernel<<<dim3(unsigned(n_v_heads), unsigned((dv + kStateCols - 1) / kStateCols)), kStateThreads,
                         smem, compute_stream()>>>(k, T, c0 * kChunk, nc, n_k_heads, n_v_heads, dk, dv, cp, state, out);
    CUDA_CHECK_LAUNCH();
  }
}

void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                      int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out) {
  if (T >= kDeltaChunkedMinTokens && chunked_delta_rule_fits(k, dk, dv, state, out))
    gated_delta_rule_chunked(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state, out);
  else
    gated_delta_rule_recurrent(q, k, v, g, beta, T, n_k_heads, n_v_heads, dk, dv, state, out);
}

}  // namespace ms::cuda
