#pragma once
// What the matvec kernels share about weights (WeightArgs, chunks of 32 weights, load_chunk), and
// the float dot products (matmul.cu, moe.cu): rows decoded to float a chunk of 32 weights at a
// time against activations staged in shared memory. bf16 rows take this path, and so do affine
// rows the tensor cores do not (tensor_core_layout: 5 and 6 bits, groups of 16, f32 scales, as
// GGUF imports hold). The tensor-core path's staging of x is the smaller, so that no
// row fits only here. A thread decodes a chunk of 32 consecutive weights of a row for R rows at
// once, so that each activation it reads from shared memory serves R rows; a group of up to 32
// threads (lanes) splits a row's chunks and sums by shuffles.
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

inline constexpr int kFloatRows = 2;  // rows a thread dots at once in float

struct WeightArgs {
  const uint8_t* data;
  const uint16_t* scales;  // f32 scales: two words each
  const uint16_t* biases;
  int rows, cols;
  int chunks_per_group_log2;  // the tensor-core path's groups (32 weights or more)
  int group_log2 = 0;         // the float path's: log2 of the group, 16 to 128
  ScaleType scale_type = ScaleType::BF16;
};


template <int BITS>
__device__ __forceinline__ void load_chunk(const uint8_t* p, uint32_t (&w)[BITS]) {
  if constexpr (BITS == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x, w[1] = v.y;
  } else if constexpr (BITS == 3 || BITS == 5) {  // 12 or 20 bytes: 4-byte aligned only
    const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int i = 0; i < BITS; ++i) w[i] = __ldg(q + i);
  } else if constexpr (BITS == 6) {  // 24 bytes: 8-byte aligned
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i);
      w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
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

// Chunk c of rows r0 .. r0 + kFloatRows − 1 (past the end: the last row) of each of the M
// matrices, of BITS bits a weight (16: bf16).
template <int BITS, int M>
__device__ __forceinline__ void load_row_chunks(const WeightArgs (&W)[M], int r0, int c,
                                                uint32_t (&w)[M][kFloatRows][BITS]) {
  constexpr size_t kChunkBytes = kChunk * BITS / 8;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kFloatRows; ++r) {
      const int row = min(r0 + r, W[m].rows - 1);
      load_chunk<BITS>(W[m].data + size_t(row) * size_t(W[m].cols / kChunk) * kChunkBytes + size_t(c) * kChunkBytes,
                       w[m][r]);
    }
}

// Values [8·st, 8·st + 8) of chunk c of each of the TT rows stage_activations staged, as two float4.
template <int TT>
__device__ __forceinline__ void load_x_step(const float4* xs, int nchunks, int c, int st, float4 (&xv)[TT][2]) {
#pragma unroll
  for (int t = 0; t < TT; ++t)
#pragma unroll
    for (int j = 0; j < 2; ++j) xv[t][j] = xs[(t * nchunks + c) * kChunkSlots + st * 2 + j];
}

// d += v · (xv[0], xv[1]): the 8 products in order, one FMA each.
__device__ __forceinline__ void fma8(const float (&v)[8], const float4 (&xv)[2], float& d) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    d = fmaf(v[4 * j], xv[j].x, d);
    d = fmaf(v[4 * j + 1], xv[j].y, d);
    d = fmaf(v[4 * j + 2], xv[j].z, d);
    d = fmaf(v[4 * j + 3], xv[j].w, d);
  }
}

// The 8 float32 weights of step st of chunk c of `row` of W.
__device__ __forceinline__ void f32_step(const WeightArgs& W, int row, int c, int st, float (&v)[8]) {
  const float4* p = reinterpret_cast<const float4*>(W.data) + (size_t(row) * W.cols + size_t(c) * kChunk + st * 8) / 4;
  const float4 a = __ldg(p), b = __ldg(p + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// acc[m][r][t] += this lane's share (chunks lane, lane + split, ...) of row r0 + r of W[m] · x_t,
// rows of bf16 (BITS 16) or float32 (BITS 32: a GGUF's routers, which llama.cpp keeps in f32),
// for the TT token rows staged by stage_activations. The M matrices have the same cols. A bf16
// chunk of every matrix is loaded whole first, so that all those loads are in flight at once; a
// float32 one (twice the bytes) a step of 8 at a time. Rows past the end repeat the last (their
// results are not to be stored).
template <int BITS, int TT, int M>
__device__ __forceinline__ void dot_rows(const float4* xs, const WeightArgs (&W)[M], int r0, int lane, int split,
                                         float (&acc)[M][kFloatRows][TT]) {
  static_assert(BITS == 16 || BITS == 32);
  constexpr int R = kFloatRows;
  const int nchunks = W[0].cols / kChunk;
  for (int c = lane; c < nchunks; c += split) {
    uint32_t w[M][R][16];
    if constexpr (BITS == 16) load_row_chunks<16, M>(W, r0, c, w);
    float dot[M][R][TT] = {};
#pragma unroll
    for (int st = 0; st < kChunk / 8; ++st) {
      float4 xv[TT][2];
      load_x_step<TT>(xs, nchunks, c, st, xv);
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float v[8];
          if constexpr (BITS == 16)
            bf16_step(w[m][r], st, v);
          else
            f32_step(W[m], min(r0 + r, W[m].rows - 1), c, st, v);
#pragma unroll
          for (int t = 0; t < TT; ++t) fma8(v, xv[t], dot[m][r][t]);
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

// Code i (a compile-time constant once unrolled) of a chunk's BITS words: bits
// [i·BITS, (i+1)·BITS) of the row's little-endian bit stream, as a float (exact).
template <int BITS>
__device__ __forceinline__ float code_value(const uint32_t (&w)[BITS], int i) {
  const int bit = i * BITS, k = bit / 32, s = bit % 32;
  const uint32_t v = s + BITS <= 32 ? w[k] >> s : __funnelshift_r(w[k], w[k + 1 < BITS ? k + 1 : k], s);
  // 2^23 + code as a float, less 2^23: cheaper than an integer conversion.
  return __uint_as_float((v & ((1u << BITS) - 1)) | 0x4b000000u) - 8388608.f;
}

// The affine form of dot_rows: acc[m][r][t] += this lane's share of the BITS-bit row r0 + r of
// W[m] · x_t, in float. Each half chunk (16 weights: the smallest group) sums Σ q·x and Σ x, then
// adds scale·Σq·x + bias·Σx with its own group's scale and bias, of any ScaleType.
template <int BITS, int TT, int M>
__device__ __forceinline__ void dot_rows_affine(const float4* xs, const WeightArgs (&W)[M], int r0, int lane,
                                                int split, float (&acc)[M][kFloatRows][TT]) {
  constexpr int R = kFloatRows;
  const int nchunks = W[0].cols / kChunk;
  for (int c = lane; c < nchunks; c += split) {
    uint32_t w[M][R][BITS];
    load_row_chunks<BITS, M>(W, r0, c, w);
    float qx[M][R][TT][2] = {}, sx[TT][2] = {};
#pragma unroll
    for (int st = 0; st < kChunk / 8; ++st) {
      float4 xv[TT][2];
      load_x_step<TT>(xs, nchunks, c, st, xv);
#pragma unroll
      for (int t = 0; t < TT; ++t)
#pragma unroll
        for (int j = 0; j < 2; ++j) sx[t][st / 2] += (xv[t][j].x + xv[t][j].y) + (xv[t][j].z + xv[t][j].w);
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float v[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) v[i] = code_value<BITS>(w[m][r], 8 * st + i);
#pragma unroll
          for (int t = 0; t < TT; ++t) fma8(v, xv[t], qx[m][r][t][st / 2]);
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = min(r0 + r, W[m].rows - 1);
        const uint32_t g0 = uint32_t(row) * uint32_t(W[m].cols >> W[m].group_log2);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t g = g0 + (uint32_t(c * kChunk + 16 * h) >> W[m].group_log2);
          const float s = scale_at(W[m].scales, g, W[m].scale_type), b = scale_at(W[m].biases, g, W[m].scale_type);
#pragma unroll
          for (int t = 0; t < TT; ++t) acc[m][r][t] += fmaf(s, qx[m][r][t][h], b * sx[t][h]);
        }
      }
  }
}

// dot_rows for rows of BITS bits: 16 for bf16, 32 for float32, else affine.
template <int BITS, int TT, int M>
__device__ __forceinline__ void dot_rows_of(const float4* xs, const WeightArgs (&W)[M], int r0, int lane, int split,
                                            float (&acc)[M][kFloatRows][TT]) {
  if constexpr (BITS == 16 || BITS == 32)
    dot_rows<BITS, TT, M>(xs, W, r0, lane, split, acc);
  else
    dot_rows_affine<BITS, TT, M>(xs, W, r0, lane, split, acc);
}

// Sums v over the `split` lanes of a group (split a power of two ≤ 32, groups aligned in the
// warp), every lane getting the total. All lanes of the warp must call it.
__device__ __forceinline__ float sum_lanes(float v, int split) {
  for (int o = split / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace ms::cuda
