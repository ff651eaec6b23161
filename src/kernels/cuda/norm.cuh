#pragma once
// RMSNorm of a row by one block of THREADS threads, shared by the norm kernels (ops.cu) and by the
// kernels whose last block adds their output into the residual and norms it (AddNormArgs).
#include <cuda_runtime.h>

#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {

inline constexpr int kRowBatch = 8;  // loads a thread issues at once: a 2048-wide row in one go at 256 threads

// Rows of up to row_in_registers values are held in registers, kRowBatch a thread (f(u, i) for
// its values i = threadIdx.x + u·THREADS), between the sum of squares and the output: each value
// is read once and all of a thread's loads are in flight together (the two-pass form reads x
// again after the block's sum, one more memory latency in a decode step's chain).
template <int THREADS>
inline constexpr int row_in_registers = THREADS * kRowBatch;

template <int THREADS, class F>
__device__ __forceinline__ void for_row_values(int dim, F&& f) {
#pragma unroll
  for (int u = 0; u < kRowBatch; ++u)
    if (int(threadIdx.x) + u * THREADS < dim) f(u, int(threadIdx.x) + u * THREADS);
}

// o = x / sqrt(mean(x²) + eps) · (offset + w) for a row of x whose Σx² this thread's share of is ss.
template <int THREADS>
__device__ __forceinline__ void rmsnorm_row(const float* xr, float ss, int dim, const float* w, float offset,
                                            float eps, float* o) {
  ss = block_reduce<THREADS, false>(ss);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  load_then_store<THREADS, kRowBatch>(
      dim, [&](int i) { return make_float2(xr[i], w[i]); }, [&](int i, float2 v) { o[i] = v.x * inv * (offset + v.y); });
}

// rmsnorm_row for a row held in registers: v its values, w the norm's weights at them.
template <int THREADS>
__device__ __forceinline__ void rmsnorm_held_row(const float (&v)[kRowBatch], const float (&w)[kRowBatch], float ss,
                                                 int dim, float offset, float eps, float* o) {
  ss = block_reduce<THREADS, false>(ss);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  for_row_values<THREADS>(dim, [&](int u, int i) { o[i] = v[u] * inv * (offset + w[u]); });
}

// xr += yr, then rmsnorm_row's o of it. yr is read from the L2 (__ldcg): in a kernel's last block
// it is what the other blocks just wrote.
template <int THREADS>
__device__ __forceinline__ void add_rmsnorm_row(float* xr, const float* yr, int dim, const float* w, float offset,
                                                float eps, float* o) {
  float ss = 0.f;
  if (dim <= row_in_registers<THREADS>) {
    float v[kRowBatch] = {}, wv[kRowBatch] = {};
    for_row_values<THREADS>(dim, [&](int u, int i) { v[u] = xr[i] + __ldcg(yr + i), wv[u] = w[i]; });
    for_row_values<THREADS>(dim, [&](int u, int i) {
      xr[i] = v[u];
      ss += v[u] * v[u];
    });
    return rmsnorm_held_row<THREADS>(v, wv, ss, dim, offset, eps, o);
  }
  load_then_store<THREADS, kRowBatch>(
      dim, [&](int i) { return xr[i] + __ldcg(yr + i); },
      [&](int i, float v) {
        xr[i] = v;
        ss += v * v;
      });
  rmsnorm_row<THREADS>(xr, ss, dim, w, offset, eps, o);
}

// A decode kernel's epilogue (cuda::AddNorm, kernels/cuda/ops.h): once every block of the grid
// has written its part of y [dim], the last of them to finish does x += y, out = rmsnorm(x) ·
// (offset + w): the residual add and norm after a layer's last product, without a launch of its
// own. counter: zero before the kernel (completion_counter()), left zero after it. x null: none.
struct AddNormArgs {
  float* x = nullptr;
  const float* w = nullptr;
  float offset = 0.f, eps = 0.f;
  float* out = nullptr;
  unsigned* counter = nullptr;
};

// Called by every thread of every block, after the block's stores of y. Not inlined: in its own
// frame, so that the kernel's registers before it are allocated as if it were not there (inlined,
// the 2- and 3-bit matvec and down kernels spilled more).
template <int THREADS>
__device__ __noinline__ void add_rmsnorm_when_done(const AddNormArgs& a, const float* y, int dim) {
  if (!a.x) return;  // uniform over the grid
  __shared__ bool last;
  __threadfence();  // this thread's part of y is visible to the grid before the block counts itself done
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counter, 1u) == gridDim.x * gridDim.y * gridDim.z - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other blocks' y, counted before this block's, is read after
  add_rmsnorm_row<THREADS>(a.x, y, dim, a.w, a.offset, a.eps, a.out);
  if (threadIdx.x == 0) *a.counter = 0;
}

}  // namespace ms::cuda
