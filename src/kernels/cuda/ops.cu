// Row-wise and elementwise kernels: norms, RoPE, SiLU·up, softmax, top-k. One block per row for
// the row-wise ones (rows are a few thousand values at most); results follow the CPU kernels'
// formulas, sums reduced in a tree rather than in order.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/check.h"
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

__global__ void rmsnorm_kernel(const float* x, int dim, const float* w, float offset, float eps, float* out) {
  const float* xr = x + size_t(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
  rmsnorm_row(xr, ss, dim, w, offset, eps, out + size_t(blockIdx.x) * dim);
}

// x += y, then rmsnorm_kernel's out of it: the residual add before a norm, in one launch.
__global__ void add_rmsnorm_kernel(float* x, const float* y, int dim, const float* w, float offset, float eps,
                                   float* out) {
  float* xr = x + size_t(blockIdx.x) * dim;
  const float* yr = y + size_t(blockIdx.x) * dim;
  float ss = 0.f;
  load_then_store<kThreads, kBatch>(
      dim, [&](int i) { return xr[i] + yr[i]; },
      [&](int i, float v) {
        xr[i] = v;
        ss += v * v;
      });
  rmsnorm_row(xr, ss, dim, w, offset, eps, out + size_t(blockIdx.x) * dim);
}

// x / sqrt(mean(x²) + eps) · w · silu(z); the sum of squares in double as on the CPU.
__global__ void rmsnorm_gated_kernel(const float* x, const float* z, const float* w, int dim, float eps,
                                     float* out) {
  const float* xr = x + size_t(blockIdx.x) * dim;
  const float* zr = z + size_t(blockIdx.x) * dim;
  float* o = out + size_t(blockIdx.x) * dim;
  double ss = 0.0;
  for (int i = threadIdx.x; i < dim; i += kThreads) ss += double(xr[i]) * xr[i];
  ss = block_reduce<kThreads, false>(ss);
  const float inv = float(1.0 / sqrt(ss / dim + double(eps)));
  load_then_store<kThreads, kBatch>(
      dim, [&](int i) { return make_float3(xr[i], zr[i], w[i]); },
      [&](int i, float3 v) { o[i] = silu(v.y) * (v.z * (v.x * inv)); });
}

// One thread per (token, head, rotated pair); the frequency as the CPU computes it (double pow,
// rounded to float), the angle in float.
__global__ void rope_kernel(float* x, int T, int heads, int head_dim, int rot_dim, int pos0, const int* pos_on_device,
                            double theta) {
  const int half = rot_dim / 2;
  const int64_t id = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (id >= int64_t(T) * heads * half) return;
  const int i = int(id % half);
  const int64_t th = id / half;  // token * heads + head
  const int t = int(th / heads);
  const float inv_freq = float(1.0 / pow(theta, double(2 * i) / double(rot_dim)));
  const float angle = float((pos_on_device ? *pos_on_device : pos0) + t) * inv_freq;
  float s, c;
  sincosf(angle, &s, &c);
  float* v = x + size_t(th) * head_dim;
  const float a = v[i], b = v[i + half];
  v[i] = a * c - b * s;
  v[i + half] = b * c + a * s;
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
  rmsnorm_kernel<<<rows, kThreads, 0, compute_stream()>>>(x, dim, w, offset, eps, out);
  CUDA_CHECK_LAUNCH();
}

void add_rmsnorm(float* x, const float* y, int rows, int dim, const float* w, float offset, float eps, float* out) {
  if (rows <= 0) return;
  add_rmsnorm_kernel<<<rows, kThreads, 0, compute_stream()>>>(x, y, dim, w, offset, eps, out);
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out) {
  if (rows <= 0) return;
  rmsnorm_gated_kernel<<<rows, kThreads, 0, compute_stream()>>>(x, z, w, dim, eps, out);
  CUDA_CHECK_LAUNCH();
}

void rope(float* x, int T, int heads, int head_dim, int rot_dim, int pos0, double theta, const int* pos_on_device) {
  if (rot_dim % 2 != 0 || rot_dim > head_dim)
    arg_fail("cuda::rope: rot_dim " + std::to_string(rot_dim) + " is odd or exceeds head_dim " +
             std::to_string(head_dim));
  const int64_t n = int64_t(T) * heads * (rot_dim / 2);
  if (n <= 0) return;
  rope_kernel<<<blocks_for(n), kThreads, 0, compute_stream()>>>(x, T, heads, head_dim, rot_dim, pos0, pos_on_device, theta);
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
