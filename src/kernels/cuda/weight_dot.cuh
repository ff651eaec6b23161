#pragma once
// What the matvec kernels share about weights (WeightArgs, chunks of 32 weights, load_chunk), and
// the bf16 dot products (matmul.cu, moe.cu): bf16 rows decoded a chunk of 32 weights at a time
// against activations staged in shared memory. Affine rows go to the tensor cores (mma_dot.cuh),
// whose staging of x is also the smaller, so that no row fits only here. A thread decodes a chunk
// of 32 consecutive weights of a row for R rows at once, so that each activation it reads from
// shared memory serves R rows; a group of up to 32 threads (lanes) splits a row's chunks and sums
// by shuffles.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {

inline constexpr int kChunk = 32;  // weights a thread decodes at once
// float4 slots per chunk of activations in shared memory: 8 and one of padding, so that the 8
// lanes of a 16-byte access phase, reading the same slot of consecutive chunks, hit distinct banks.
inline constexpr int kChunkSlots = 9;

inline constexpr int kBf16Rows = 2;  // bf16 rows a thread dots at once

struct WeightArgs {
  const uint8_t* data;
  const uint16_t* scales;
  const uint16_t* biases;
  int rows, cols;
  int chunks_per_group_log2;
};

template <int BITS>
__device__ __forceinline__ void load_chunk(const uint8_t* p, uint32_t (&w)[BITS]) {
  if constexpr (BITS == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x, w[1] = v.y;
  } else if constexpr (BITS == 3) {  // 12 bytes: 4-byte aligned only
    const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
    w[0] = __ldg(q), w[1] = __ldg(q + 1), w[2] = __ldg(q + 2);
  } else {
#pragma unroll
    for (int i = 0; i < BITS / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  }
}

// bf16 weights [8·st, 8·st + 8) of a chunk (st a compile-time constant once unrolled).
__device__ __forceinline__ void bf16_step(const uint32_t (&w)[16], int st, float (&v)[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = __uint_as_float(w[4 * st + j] << 16);
    v[2 * j + 1] = __uint_as_float(w[4 * st + j] & 0xffff0000u);
  }
}

// Bytes of shared memory stage_activations fills for n rows of `cols` activations.
inline size_t staged_bytes(int n, int cols) { return size_t(n) * size_t(cols / kChunk) * kChunkSlots * sizeof(float4); }

// Stages n rows of activations x [n, cols] (rows from `valid` on read as zero) for dot_rows:
// xs [n][cols/32][kChunkSlots] float4. Every thread of the block must call it; it ends with a
// barrier.
template <int THREADS>
__device__ __forceinline__ void stage_activations(const float* __restrict__ x, int n, int valid, int cols, float4* xs) {
  const int nchunks = cols / kChunk;
  for (int i = threadIdx.x; i < n * nchunks * 8; i += THREADS) {
    const int t = i / (nchunks * 8), j = i % (nchunks * 8);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < valid) v = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * cols) + j);
    xs[(t * nchunks + j / 8) * kChunkSlots + j % 8] = v;
  }
  __syncthreads();
}

// acc[m][r][t] += this lane's share (chunks lane, lane + split, ...) of bf16 row r0 + r of W[m] ·
// x_t, for the TT token rows staged by stage_activations. The M matrices have the same cols;
// their chunks are loaded together so that the loads of all are in flight at once. Rows past the
// end repeat the last (their results are not to be stored).
template <int TT, int M>
__device__ __forceinline__ void dot_rows(const float4* xs, const WeightArgs (&W)[M], int r0, int lane, int split,
                                         float (&acc)[M][kBf16Rows][TT]) {
  constexpr int R = kBf16Rows;
  const int nchunks = W[0].cols / kChunk;
  for (int c = lane; c < nchunks; c += split) {
    uint32_t w[M][R][16];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = min(r0 + r, W[m].rows - 1);
        load_chunk<16>(W[m].data + size_t(row) * W[m].cols * 2 + size_t(c) * (kChunk * 2), w[m][r]);
      }
    float dot[M][R][TT] = {};
#pragma unroll
    for (int st = 0; st < kChunk / 8; ++st) {
      float4 xv[TT][2];
#pragma unroll
      for (int t = 0; t < TT; ++t)
#pragma unroll
        for (int j = 0; j < 2; ++j) xv[t][j] = xs[(t * nchunks + c) * kChunkSlots + st * 2 + j];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float v[8];
          bf16_step(w[m][r], st, v);
#pragma unroll
          for (int t = 0; t < TT; ++t)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              dot[m][r][t] = fmaf(v[4 * j], xv[t][j].x, dot[m][r][t]);
              dot[m][r][t] = fmaf(v[4 * j + 1], xv[t][j].y, dot[m][r][t]);
              dot[m][r][t] = fmaf(v[4 * j + 2], xv[t][j].z, dot[m][r][t]);
              dot[m][r][t] = fmaf(v[4 * j + 3], xv[t][j].w, dot[m][r][t]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TT; ++t) acc[m][r][t] += dot[m][r][t];
  }
}

// Sums v over the `split` lanes of a group (split a power of two ≤ 32, groups aligned in the
// warp), every lane getting the total. All lanes of the warp must call it.
__device__ __forceinline__ float sum_lanes(float v, int split) {
  for (int o = split / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace ms::cuda
