#pragma once
// The float weight decoding and dot products of the matvec kernels (moe.cu; matmul.cu for bf16,
// and for affine rows too wide for mma_dot.cuh's staging): bf16 and affine 2/3/4/8-bit rows,
// decoded a chunk of 32 weights at a time against activations staged in shared memory. A thread decodes a chunk of 32 consecutive weights of a row (BITS 32-bit words,
// all in one quantization group since groups are multiples of 32) for R rows at once, so that
// each activation it reads from shared memory serves R rows; a group of up to 32 threads (lanes)
// splits a row's chunks and sums by shuffles.
#include <cuda_fp16.h>
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

// Rows per thread: fewer for wide chunks, to bound the registers holding them.
template <int BITS>
inline constexpr int kRowsPerThread = BITS <= 4 ? 4 : 2;

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

// Weight i (a compile-time constant once unrolled) of a chunk: the bf16 value, or the affine code q.
template <int BITS>
__device__ __forceinline__ float chunk_value(const uint32_t (&w)[BITS], int i) {
  if constexpr (BITS == 16) {
    return __uint_as_float((i & 1) ? (w[i / 2] & 0xffff0000u) : (w[i / 2] << 16));
  } else {
    const int bit = i * BITS, word = bit / 32, off = bit % 32;
    uint32_t raw = w[word] >> off;
    if (off + BITS > 32) raw = __funnelshift_r(w[word], w[word + 1 < BITS ? word + 1 : word], off);
    // The bits of the float 2^23 + q, minus 2^23: q exactly, without a slow int-to-float conversion.
    return __uint_as_float(0x4B000000u | (raw & ((1u << BITS) - 1))) - 8388608.0f;
  }
}

// Two codes at once: `bits` holds m·q in the low half and m·q' in the high half (m a power of two,
// m·q < 1024); or'ed into the halves 1024.0 (0x6400) they read 1024 + m·q exactly, and one half2
// FMA (·1/m, −1024/m) leaves (q, q') exactly. One logic op per two codes instead of two per code.
template <int M>
__device__ __forceinline__ float2 code_pair(uint32_t bits) {
  uint32_t u = bits | 0x64006400u;
  const __half2 h = *reinterpret_cast<const __half2*>(&u);
  const __half2 q = __hfma2(h, __float2half2_rn(1.0f / M), __float2half2_rn(-1024.0f / M));
  return __half22float2(q);
}

// 3-bit code i (a compile-time constant once unrolled) of a chunk, masked in place: with its bits
// at offset o of the mantissa of the float 2^(23-o) (o <= 20), that float reads 2^(23-o) + q
// exactly, so one logic op and one add decode it. Codes at higher offsets, or straddling two
// words, are read from the word pair shifted right by 16 (one funnel shift per word).
__device__ __forceinline__ float code3(const uint32_t (&w)[3], int i) {
  const int bit = 3 * i, word = bit / 32;
  int off = bit % 32;
  uint32_t u = w[word];
  if (off > 20) {
    u = __funnelshift_r(w[word], w[word + 1 < 3 ? word + 1 : word], 16);
    off -= 16;
  }
  const uint32_t magic = uint32_t(150 - off) << 23;  // the bits of 2^(23-off)
  return __uint_as_float((u & (7u << off)) | magic) - __uint_as_float(magic);
}

// Weights a step of the inner loop decodes: one 32-bit word of 2-bit codes, 8 weights otherwise.
template <int BITS>
inline constexpr int kStep = BITS == 2 ? 16 : 8;

// Weights [st·kStep, (st+1)·kStep) of a chunk (st a compile-time constant once unrolled).
template <int BITS>
__device__ __forceinline__ void decode_step(const uint32_t (&w)[BITS], int st, float (&v)[kStep<BITS>]) {
  if constexpr (BITS == 8) {  // words 2st, 2st+1: bytes (0, 2) and (1, 3) of each
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t x = w[2 * st + h];
      const float2 a = code_pair<1>(x & 0x00FF00FFu), b = code_pair<1>((x >> 8) & 0x00FF00FFu);
      v[4 * h] = a.x, v[4 * h + 1] = b.x, v[4 * h + 2] = a.y, v[4 * h + 3] = b.y;
    }
  } else if constexpr (BITS == 4) {  // word st: nibbles (0, 4), (1, 5) of it, (2, 6), (3, 7) of it >> 8
    const uint32_t x = w[st], y = x >> 8;
    const float2 a = code_pair<1>(x & 0x000F000Fu), b = code_pair<16>(x & 0x00F000F0u);
    const float2 c = code_pair<1>(y & 0x000F000Fu), d = code_pair<16>(y & 0x00F000F0u);
    v[0] = a.x, v[1] = b.x, v[2] = c.x, v[3] = d.x, v[4] = a.y, v[5] = b.y, v[6] = c.y, v[7] = d.y;
  } else if constexpr (BITS == 2) {  // word st: codes (j, 8+j) of it and (4+j, 12+j) of it >> 8
    const uint32_t x = w[st], y = x >> 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t mask = 0x00030003u << (2 * j);
      float2 a, b;
      switch (j) {  // the scale is a template argument: a literal per unrolled j
        case 0: a = code_pair<1>(x & mask), b = code_pair<1>(y & mask); break;
        case 1: a = code_pair<4>(x & mask), b = code_pair<4>(y & mask); break;
        case 2: a = code_pair<16>(x & mask), b = code_pair<16>(y & mask); break;
        default: a = code_pair<64>(x & mask), b = code_pair<64>(y & mask); break;
      }
      v[j] = a.x, v[8 + j] = a.y, v[4 + j] = b.x, v[12 + j] = b.y;
    }
  } else if constexpr (BITS == 3) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = code3(w, 8 * st + j);
  } else {  // bf16
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = chunk_value<BITS>(w, 8 * st + j);
  }
}

// Bytes of shared memory stage_activations fills for n rows of `cols` activations.
inline size_t staged_bytes(int n, int cols) {
  return size_t(n) * size_t(cols / kChunk) * (kChunkSlots * sizeof(float4) + sizeof(float));
}

// Stages n rows of activations x [n, cols] (rows from `valid` on read as zero) for dot_rows:
// xs [n][cols/32][kChunkSlots] float4 and, for affine weights, xsum [n][cols/32] (Σx per chunk,
// for the bias term b·Σx). Every thread of the block must call it; it ends with a barrier.
template <int BITS, int THREADS>
__device__ __forceinline__ void stage_activations(const float* __restrict__ x, int n, int valid, int cols, float4* xs,
                                                  float* xsum) {
  const int nchunks = cols / kChunk;
  for (int i = threadIdx.x; i < n * nchunks * 8; i += THREADS) {
    const int t = i / (nchunks * 8), j = i % (nchunks * 8);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < valid) v = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * cols) + j);
    xs[(t * nchunks + j / 8) * kChunkSlots + j % 8] = v;
  }
  __syncthreads();
  if constexpr (BITS != 16) {
    for (int i = threadIdx.x; i < n * nchunks; i += THREADS) {
      const float4* c = xs + size_t(i) * kChunkSlots;
      float s = 0.f;
      for (int j = 0; j < 8; ++j) s += (c[j].x + c[j].y) + (c[j].z + c[j].w);
      xsum[i] = s;
    }
    __syncthreads();
  }
}

// acc[m][r][t] += this lane's share (chunks lane, lane + split, ...) of row r0 + r of W[m] · x_t,
// for the TT token rows staged by stage_activations (xs, xsum). The M matrices have the same
// cols; their chunks are loaded together so that the loads of all are in flight at once. Rows
// past the end repeat the last (their results are not to be stored).
template <int BITS, int TT, int M>
__device__ __forceinline__ void dot_rows(const float4* xs, const float* xsum, const WeightArgs (&W)[M], int r0,
                                         int lane, int split, float (&acc)[M][kRowsPerThread<BITS>][TT]) {
  constexpr int R = kRowsPerThread<BITS>;
  const int nchunks = W[0].cols / kChunk;
  for (int c = lane; c < nchunks; c += split) {
    uint32_t w[M][R][BITS];
    float scale[M][R], bias[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = min(r0 + r, W[m].rows - 1);
        const size_t row_bytes = size_t(W[m].cols) * BITS / 8;
        load_chunk<BITS>(W[m].data + size_t(row) * row_bytes + size_t(c) * (kChunk * BITS / 8), w[m][r]);
        if constexpr (BITS != 16) {
          const size_t g = size_t(row) * (nchunks >> W[m].chunks_per_group_log2) + (c >> W[m].chunks_per_group_log2);
          scale[m][r] = bf16_to_float(__ldg(W[m].scales + g));
          bias[m][r] = bf16_to_float(__ldg(W[m].biases + g));
        }
      }
    constexpr int S = kStep<BITS>;
    float dot[M][R][TT] = {};
#pragma unroll
    for (int st = 0; st < kChunk / S; ++st) {
      float4 xv[TT][S / 4];
#pragma unroll
      for (int t = 0; t < TT; ++t)
#pragma unroll
        for (int j = 0; j < S / 4; ++j) xv[t][j] = xs[(t * nchunks + c) * kChunkSlots + st * (S / 4) + j];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float v[S];
          decode_step<BITS>(w[m][r], st, v);
#pragma unroll
          for (int t = 0; t < TT; ++t)
#pragma unroll
            for (int j = 0; j < S / 4; ++j) {
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
        for (int t = 0; t < TT; ++t) {
          if constexpr (BITS == 16)
            acc[m][r][t] += dot[m][r][t];
          else
            acc[m][r][t] += fmaf(scale[m][r], dot[m][r][t], bias[m][r] * xsum[t * nchunks + c]);
        }
  }
}

// Sums v over the `split` lanes of a group (split a power of two ≤ 32, groups aligned in the
// warp), every lane getting the total. All lanes of the warp must call it.
__device__ __forceinline__ float sum_lanes(float v, int split) {
  for (int o = split / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace ms::cuda
