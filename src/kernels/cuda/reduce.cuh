#pragma once
// Warp and block reductions shared by the CUDA kernels.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "quant/affine.h"

namespace ms::cuda {

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum or max over the block (blockDim.x == THREADS, a multiple of 32), returned to every thread.
// May be called repeatedly in one kernel: each call ends with a barrier after its result is set
// and begins by writing a different array than the one the previous result is read from.
template <int THREADS, bool MAX, class T>
__device__ T block_reduce(T v) {
  __shared__ T part[THREADS / 32];
  __shared__ T total;
  v = MAX ? T(warp_max(float(v))) : warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    T s = threadIdx.x < THREADS / 32 ? part[threadIdx.x] : part[0];
    if (!MAX && threadIdx.x >= THREADS / 32) s = T(0);
    s = MAX ? T(warp_max(float(s))) : warp_sum(s);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  return total;
}

struct Best {
  float v;
  int i;
};

// a ranks before b: larger value, then lower index.
__device__ __forceinline__ Best better(Best a, Best b) { return (a.v > b.v || (a.v == b.v && a.i < b.i)) ? a : b; }

// The k largest of v[0..n), largest first, ties to the lower index (cpu::top_k): k rounds of a
// block argmax, each excluding the indices already taken; every thread calls pick(round, index,
// value) with each round's winner, in order. taken: shared memory of n bytes. Thread j reads and
// marks only the indices j, j + THREADS, ... and every thread finds each round's winner from the
// warps' bests (two buffers, by round parity), so that a round takes one barrier. Called by every
// thread of the block; ends with a barrier.
template <int THREADS, class Pick>
__device__ void block_top_k(const float* v, int n, int k, unsigned char* taken, Pick&& pick) {
  __shared__ Best warp_best[2][THREADS / 32];
  for (int i = threadIdx.x; i < n; i += THREADS) taken[i] = 0;
  for (int round = 0; round < k; ++round) {
    Best b{-INFINITY, INT_MAX};
    for (int i = threadIdx.x; i < n; i += THREADS)
      if (!taken[i]) b = better(b, Best{v[i], i});
    for (int o = 16; o > 0; o >>= 1)
      b = better(b, Best{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)});
    Best* bests = warp_best[round & 1];
    if ((threadIdx.x & 31) == 0) bests[threadIdx.x >> 5] = b;
    __syncthreads();
    Best all = bests[0];
    for (int w = 1; w < THREADS / 32; ++w) all = better(all, bests[w]);
    if (all.i < n && all.i % THREADS == int(threadIdx.x)) taken[all.i] = 1;  // all.i: INT_MAX past the NaNs
    pick(round, all.i, all.v);
  }
  __syncthreads();
}

// store(i, load(i)) for i = threadIdx.x, + THREADS, ... < n, U at a time: the U loads are issued
// before any of their stores. A plain loop waits out each load's latency in turn where its store
// may alias the next loads, as in an in-place norm (docs/PERFORMANCE.md#cuda-row-kernels).
template <int THREADS, int U, class Load, class Store>
__device__ __forceinline__ void load_then_store(int n, Load&& load, Store&& store) {
  using V = decltype(load(0));
  for (int i0 = threadIdx.x; i0 < n; i0 += U * THREADS) {
    V v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * THREADS < n) v[u] = load(i0 + u * THREADS);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * THREADS < n) store(i0 + u * THREADS, v[u]);
  }
}

__device__ __forceinline__ float bf16_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// Entry i of an affine matrix's scales or biases p of type st, as float (exact).
__device__ __forceinline__ float scale_at(const uint16_t* p, uint32_t i, ScaleType st) {
  if (st == ScaleType::F32) return __ldg(reinterpret_cast<const float*>(p) + i);
  const uint16_t v = __ldg(p + i);
  return st == ScaleType::F16 ? __half2float(__ushort_as_half(v)) : bf16_to_float(v);
}

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// silu(x) = x * sigmoid(x), from e = exp(-|x|) so that nothing overflows (as the CPU kernels).
__device__ __forceinline__ float silu(float x) {
  const float e = expf(-fabsf(x));
  const float r = 1.0f / (1.0f + e);
  return x * (x < 0.0f ? e * r : r);
}

}  // namespace ms::cuda
