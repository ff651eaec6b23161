// Row-wise and elementwise kernels: norms, an attention layer's q/k norms and RoPE, SiLU·up,
// softmax, top-k. One block per row for the row-wise ones (rows are a few thousand values at
// most); results follow the CPU kernels' formulas, sums reduced in a tree rather than in order.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 8;  // loads a thread issues at once in the row kernels: a 2048-wide row in one go

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// o = x / sqrt(mean(x²) + eps) · (offset + w) for a row of x whose Σx² this thread's share of is ss.
__device__ __forceinline__ void rmsnorm_row(const float* xr, float ss, int dim, const float* w, float offset,
                                            float eps, float* o) {
  ss = block_reduce<kThreads, false>(ss);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  load_then_store<kThreads, kBatch>(
      dim, [&](int i) { return make_float2(xr[i], w[i]); }, [&](int i, float2 v) { o[i] = v.x * inv * (offset + v.y); });
}

// Rows of up to kRowInRegisters values are held in registers, kBatch a thread (f(u, i) for its
// values i = threadIdx.x + u·kThreads), between the sum of squares and the output: each value is
// read once and all of a thread's loads are in flight together (the two-pass form reads x again
// after the block's sum, one more memory latency in a decode step's chain).
constexpr int kRowInRegisters = kThreads * kBatch;

template <class F>
__device__ __forceinline__ void for_row_values(int dim, F&& f) {
#pragma unroll
  for (int u = 0; u < kBatch; ++u)
    if (int(threadIdx.x) + u * kThreads < dim) f(u, int(threadIdx.x) + u * kThreads);
}

// rmsnorm_row for a row held in registers: v its values, w the norm's weights at them.
__device__ __forceinline__ void rmsnorm_held_row(const float (&v)[kBatch], const float (&w)[kBatch], float ss, int dim,
                                                 float offset, float eps, float* o) {
  ss = block_reduce<kThreads, false>(ss);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  for_row_values(dim, [&](int u, int i) { o[i] = v[u] * inv * (offset + w[u]); });
}

__global__ void rmsnorm_kernel(const float* x, int dim, const float* w, float offset, float eps, float* out) {
  start_after_kernel_before();  // launched by launch_after
  const float* xr = x + size_t(blockIdx.x) * dim;
  float* o = out + size_t(blockIdx.x) * dim;
  float ss = 0.f;
  if (dim <= kRowInRegisters) {
    float v[kBatch] = {}, wv[kBatch] = {};
    for_row_values(dim, [&](int u, int i) { v[u] = xr[i], wv[u] = w[i]; });
    for_row_values(dim, [&](int u, int) { ss += v[u] * v[u]; });
    return rmsnorm_held_row(v, wv, ss, dim, offset, eps, o);
  }
  for (int i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
  rmsnorm_row(xr, ss, dim, w, offset, eps, o);
}

// x += y, then rmsnorm_kernel's out of it: the residual add before a norm, in one launch.
__global__ void add_rmsnorm_kernel(float* x, const float* y, int dim, const float* w, float offset, float eps,
                                   float* out) {
  start_after_kernel_before();  // launched by launch_after
  float* xr = x + size_t(blockIdx.x) * dim;
  const float* yr = y + size_t(blockIdx.x) * dim;
  float* o = out + size_t(blockIdx.x) * dim;
  float ss = 0.f;
  if (dim <= kRowInRegisters) {
    float v[kBatch] = {}, wv[kBatch] = {};
    for_row_values(dim, [&](int u, int i) { v[u] = xr[i] + yr[i], wv[u] = w[i]; });
    for_row_values(dim, [&](int u, int i) {
      xr[i] = v[u];
      ss += v[u] * v[u];
    });
    return rmsnorm_held_row(v, wv, ss, dim, offset, eps, o);
  }
  load_then_store<kThreads, kBatch>(
      dim, [&](int i) { return xr[i] + yr[i]; },
      [&](int i, float v) {
        xr[i] = v;
        ss += v * v;
      });
  rmsnorm_row(xr, ss, dim, w, offset, eps, o);
}

// x / sqrt(mean(x²) + eps) · w · silu(z); the sum of squares in double as on the CPU.
__global__ void rmsnorm_gated_kernel(const float* x, const float* z, const float* w, int dim, float eps,
                                     float* out) {
  start_after_kernel_before();  // launched by launch_after
  const float* xr = x + size_t(blockIdx.x) * dim;
  const float* zr = z + size_t(blockIdx.x) * dim;
  float* o = out + size_t(blockIdx.x) * dim;
  auto gated = [&](float xv, float zv, float wv, float inv) { return silu(zv) * (wv * (xv * inv)); };
  auto inverse_rms = [&](double ss) { return float(1.0 / sqrt(block_reduce<kThreads, false>(ss) / dim + double(eps))); };
  double ss = 0.0;
  if (dim <= kRowInRegisters) {
    float v[kBatch] = {}, zv[kBatch] = {}, wv[kBatch] = {};
    for_row_values(dim, [&](int u, int i) { v[u] = xr[i], zv[u] = zr[i], wv[u] = w[i]; });
    for_row_values(dim, [&](int u, int) { ss += double(v[u]) * v[u]; });
    const float inv = inverse_rms(ss);
    for_row_values(dim, [&](int u, int i) { o[i] = gated(v[u], zv[u], wv[u], inv); });
    return;
  }
  for (int i = threadIdx.x; i < dim; i += kThreads) ss += double(xr[i]) * xr[i];
  const float inv = inverse_rms(ss);
  load_then_store<kThreads, kBatch>(
      dim, [&](int i) { return make_float3(xr[i], zr[i], w[i]); },
      [&](int i, float3 v) { o[i] = gated(v.x, v.y, v.z, inv); });
}

// Block (head, t) of an attention layer's heads of token t: a head of q (< nh) or k (< nh + nkv)
// RMS-normalised (rmsnorm_row's formula) and rotated (cpu::rope's: the frequency in double pow
// rounded to float, the angle in float), q's to q and its gate half to gate where the layer is
// gated, k's to the cache row of position pos + t; past them a head of v, copied to its row.
__global__ void __launch_bounds__(kThreads) attention_prepare_kernel(const AttentionPrep a) {
  start_after_kernel_before();  // launched by launch_after
  extern __shared__ float normed[];  // [hd]: the head before its rotation
  const int head = blockIdx.x, t = blockIdx.y, hd = a.hd;
  const int pos = (a.pos_on_device ? *a.pos_on_device : a.pos0) + t;
  const size_t kv_width = size_t(a.nkv) * hd, cache_row = size_t(a.rows_from_zero ? t : pos) * kv_width;
  if (head >= a.nh + a.nkv) {  // uniform over the block
    const size_t j = size_t(head - a.nh - a.nkv) * hd;
    for (int i = threadIdx.x; i < hd; i += kThreads) a.v_cache[cache_row + j + i] = a.v[t * kv_width + j + i];
    return;
  }
  const bool is_q = head < a.nh;
  const int j = is_q ? head : head - a.nh, q_stride = a.gated ? 2 * hd : hd;  // q_raw's heads
  const float* src = is_q ? a.q_raw + (size_t(t) * a.nh + j) * q_stride : a.k + t * kv_width + size_t(j) * hd;
  float* dst = is_q ? a.q + (size_t(t) * a.nh + j) * hd : a.k_cache + cache_row + size_t(j) * hd;
  if (is_q && a.gated)
    for (int i = threadIdx.x; i < hd; i += kThreads) a.gate[(size_t(t) * a.nh + j) * hd + i] = src[hd + i];
  float ss = 0.f;
  for (int i = threadIdx.x; i < hd; i += kThreads) ss += src[i] * src[i];
  ss = block_reduce<kThreads, false>(ss);
  const float inv = 1.0f / sqrtf(ss / float(hd) + a.eps);
  const float* w = is_q ? a.q_norm : a.k_norm;
  for (int i = threadIdx.x; i < hd; i += kThreads) normed[i] = src[i] * inv * (a.offset + w[i]);
  __syncthreads();
  const int half = a.rot_dim / 2;
  for (int i = threadIdx.x; i < hd; i += kThreads) {
    if (i >= a.rot_dim) {
      dst[i] = normed[i];
      continue;
    }
    const int p = i % half;
    const float inv_freq = float(1.0 / pow(a.theta, double(2 * p) / double(a.rot_dim)));
    float sn, cs;
    sincosf(float(pos) * inv_freq, &sn, &cs);
    const float x0 = normed[p], x1 = normed[p + half];
    dst[i] = i < half ? x0 * cs - x1 * sn : x1 * cs + x0 * sn;
  }
}

// One thread that returns `ns` nanoseconds (the GPU's global timer) after it starts.
__global__ void wait_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

__global__ void softmax_kernel(float* x, int n) {
  float* v = x + size_t(blockIdx.x) * n;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kThreads) mx = fmaxf(mx, v[i]);
  mx = block_reduce<kThreads, true>(mx);
  float sum = 0.f;
  for (int i = threadIdx.x; i < n; i += kThreads) sum += (v[i] = expf(v[i] - mx));
  sum = block_reduce<kThreads, false>(sum);
  for (int i = threadIdx.x; i < n; i += kThreads) v[i] /= sum;
}

// One block per row.
__global__ void top_k_kernel(const float* x, int n, int k, int* idx) {
  extern __shared__ unsigned char taken[];  // [n]
  int* out = idx + size_t(blockIdx.x) * k;
  block_top_k<kThreads>(x + size_t(blockIdx.x) * n, n, k, taken, [&](int round, int i, float) {
    if (round % kThreads == int(threadIdx.x)) out[round] = i;
  });
}

}  // namespace

void rmsnorm(const float* x, int rows, int dim, const float* w, float offset, float eps, float* out) {
  if (rows <= 0) return;
  launch_after(rmsnorm_kernel, rows, kThreads, 0, x, dim, w, offset, eps, out);
  CUDA_CHECK_LAUNCH();
}

void add_rmsnorm(float* x, const float* y, int rows, int dim, const float* w, float offset, float eps, float* out) {
  if (rows <= 0) return;
  launch_after(add_rmsnorm_kernel, rows, kThreads, 0, x, y, dim, w, offset, eps, out);
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out) {
  if (rows <= 0) return;
  launch_after(rmsnorm_gated_kernel, rows, kThreads, 0, x, z, w, dim, eps, out);
  CUDA_CHECK_LAUNCH();
}

void attention_prepare(const AttentionPrep& p) {
  if (p.rot_dim % 2 != 0 || p.rot_dim > p.hd)
    arg_fail("cuda::attention_prepare: rot_dim " + std::to_string(p.rot_dim) + " is odd or exceeds head_dim " +
             std::to_string(p.hd));
  if (p.gated && !p.gate) arg_fail("cuda::attention_prepare: a gated layer and nowhere to put its gate");
  if (p.T <= 0) return;
  const dim3 grid(unsigned(p.nh + 2 * p.nkv), unsigned(p.T));
  launch_after(attention_prepare_kernel, grid, kThreads, size_t(p.hd) * sizeof(float), p);
  CUDA_CHECK_LAUNCH();
}

void wait_on_stream(void* stream, double seconds) {
  if (!(seconds > 0)) return;
  wait_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>((unsigned long long)(seconds * 1e9));
  CUDA_CHECK_LAUNCH();
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  if (n <= 0) return;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, compute_stream()>>>(gate, up, out, n);
  CUDA_CHECK_LAUNCH();
}

void softmax(float* x, int rows, int n) {
  if (rows <= 0 || n <= 0) return;
  softmax_kernel<<<rows, kThreads, 0, compute_stream()>>>(x, n);
  CUDA_CHECK_LAUNCH();
}

void top_k(const float* x, int rows, int n, int k, int* idx) {
  if (k < 0 || k > n) arg_fail("cuda::top_k: k " + std::to_string(k) + " outside 0.." + std::to_string(n));
  if (n > 48 * 1024) arg_fail("cuda::top_k: rows of " + std::to_string(n) + " values; at most 49152");
  if (rows <= 0 || k == 0) return;
  top_k_kernel<<<rows, kThreads, size_t(n), compute_stream()>>>(x, n, k, idx);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ms::cuda
