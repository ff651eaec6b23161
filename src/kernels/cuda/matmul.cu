// y = x · Wᵀ on the GPU for bf16 and affine-quantized (2/3/4/8-bit) weights: one kernel,
// specialised by BITS (16 = bf16). A thread decodes a chunk of 32 consecutive weights of a row
// (BITS 32-bit words, all in one quantization group since groups are multiples of 32) for R rows
// at once, so that each activation it reads from shared memory serves R rows; a group of up to 32
// threads splits a row's chunks and sums by shuffles. The activations of TT tokens are staged in
// shared memory once per block, and blocks loop over row sets (a grid of what fits on the chip),
// so that the weights, read once per TT tokens, are what streams from memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 32;  // weights a thread decodes at once
// float4 slots per chunk of activations in shared memory: 8 and one of padding, so that the 8
// lanes of a 16-byte access phase, reading the same slot of consecutive chunks, hit distinct banks.
constexpr int kChunkSlots = 9;
constexpr int kBatch = 4;  // tokens per block when T > 1

// Rows per thread: fewer for wide chunks, to bound the registers holding them.
template <int BITS>
constexpr int kRowsPerThread = BITS <= 4 ? 4 : 2;

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

template <int BITS, int TT>
__global__ void __launch_bounds__(kThreads) matmul_kernel(const float* __restrict__ x, int T, WeightArgs W,
                                                          float* __restrict__ y, int split_log2) {
  constexpr int R = kRowsPerThread<BITS>;
  extern __shared__ float4 smem[];
  const int nchunks = W.cols / kChunk;
  float4* xs = smem;                                                           // [TT][nchunks][kChunkSlots]
  float* xsum = reinterpret_cast<float*>(smem + size_t(TT) * nchunks * kChunkSlots);  // [TT][nchunks]
  const int t0 = blockIdx.y * TT;

  for (int i = threadIdx.x; i < TT * nchunks * 8; i += kThreads) {
    const int t = i / (nchunks * 8), j = i % (nchunks * 8);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t0 + t < T) v = __ldg(reinterpret_cast<const float4*>(x + size_t(t0 + t) * W.cols) + j);
    xs[(t * nchunks + j / 8) * kChunkSlots + j % 8] = v;
  }
  __syncthreads();
  if constexpr (BITS != 16) {  // Σx per chunk, for the bias term b·Σx
    for (int i = threadIdx.x; i < TT * nchunks; i += kThreads) {
      const float4* c = xs + size_t(i) * kChunkSlots;
      float s = 0.f;
      for (int j = 0; j < 8; ++j) s += (c[j].x + c[j].y) + (c[j].z + c[j].w);
      xsum[i] = s;
    }
    __syncthreads();
  }

  const int split = 1 << split_log2, lane = threadIdx.x & (split - 1), grp = threadIdx.x >> split_log2;
  const int groups = kThreads >> split_log2;
  const size_t row_bytes = size_t(W.cols) * BITS / 8;
  const int groups_per_row = nchunks >> W.chunks_per_group_log2;
  const int nsets = (W.rows + groups * R - 1) / (groups * R);
  for (int set = blockIdx.x; set < nsets; set += gridDim.x) {  // uniform over the block
    const int r0 = (set * groups + grp) * R;
    float acc[R][TT] = {};
    for (int c = lane; c < nchunks; c += split) {
      uint32_t w[R][BITS];
      float scale[R], bias[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = min(r0 + r, W.rows - 1);  // rows past the end repeat the last, unstored
        load_chunk<BITS>(W.data + size_t(row) * row_bytes + size_t(c) * (kChunk * BITS / 8), w[r]);
        if constexpr (BITS != 16) {
          const size_t g = size_t(row) * groups_per_row + (c >> W.chunks_per_group_log2);
          scale[r] = bf16_to_float(__ldg(W.scales + g));
          bias[r] = bf16_to_float(__ldg(W.biases + g));
        }
      }
      float dot[R][TT] = {};
#pragma unroll
      for (int i4 = 0; i4 < 8; ++i4) {
        float4 xv[TT];
#pragma unroll
        for (int t = 0; t < TT; ++t) xv[t] = xs[(t * nchunks + c) * kChunkSlots + i4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float v0 = chunk_value<BITS>(w[r], 4 * i4), v1 = chunk_value<BITS>(w[r], 4 * i4 + 1);
          const float v2 = chunk_value<BITS>(w[r], 4 * i4 + 2), v3 = chunk_value<BITS>(w[r], 4 * i4 + 3);
#pragma unroll
          for (int t = 0; t < TT; ++t) {
            dot[r][t] = fmaf(v0, xv[t].x, dot[r][t]);
            dot[r][t] = fmaf(v1, xv[t].y, dot[r][t]);
            dot[r][t] = fmaf(v2, xv[t].z, dot[r][t]);
            dot[r][t] = fmaf(v3, xv[t].w, dot[r][t]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TT; ++t) {
          if constexpr (BITS == 16)
            acc[r][t] += dot[r][t];
          else
            acc[r][t] += fmaf(scale[r], dot[r][t], bias[r] * xsum[t * nchunks + c]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < TT; ++t)
        for (int o = split / 2; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TT; ++t)
          if (r0 + r < W.rows && t0 + t < T) y[size_t(t0 + t) * W.rows + size_t(r0 + r)] = acc[r][t];
    }
  }
}

int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
  return v;
}

// Shared memory a block needs for TT tokens of `cols` activations (and their chunk sums).
size_t smem_bytes(int TT, int cols) {
  return size_t(TT) * size_t(cols / kChunk) * (kChunkSlots * sizeof(float4) + sizeof(float));
}

int floor_log2(int v) {
  int l = 0;
  while ((2 << l) <= v) ++l;
  return l;
}

template <int BITS, int TT>
void launch(const float* x, int T, const WeightArgs& W, float* y) {
  constexpr int R = kRowsPerThread<BITS>;
  auto kernel = matmul_kernel<BITS, TT>;
  static const int max_smem = [&] {
    const int m = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, m));
    return m;
  }();
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  const size_t smem = smem_bytes(TT, W.cols);
  if (smem > size_t(max_smem))
    arg_fail("cuda::matmul: " + std::to_string(W.cols) + " columns need " + std::to_string(smem) +
             " bytes of shared memory, more than the device's " + std::to_string(max_smem));
  const int split_log2 = std::min(5, floor_log2(W.cols / kChunk));
  const int rows_per_set = (kThreads >> split_log2) * R;
  const int nsets = (W.rows + rows_per_set - 1) / rows_per_set;
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  const dim3 grid(unsigned(std::min(nsets, std::max(1, per_sm) * sms)), unsigned((T + TT - 1) / TT));
  kernel<<<grid, kThreads, smem>>>(x, T, W, y, split_log2);
  CUDA_CHECK_LAUNCH();
}

template <int BITS>
void launch_bits(const float* x, int T, const WeightArgs& W, float* y) {
  static const int max_smem = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  if (T > 1 && smem_bytes(kBatch, W.cols) <= size_t(max_smem))
    launch<BITS, kBatch>(x, T, W, y);
  else
    launch<BITS, 1>(x, T, W, y);
}

bool misaligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; }

}  // namespace

void matmul(const float* x, int T, const Mat& W, float* y) {
  if (T <= 0 || W.rows <= 0) return;
  if (W.cols <= 0 || W.cols % kChunk != 0)
    arg_fail("cuda::matmul: cols " + std::to_string(W.cols) + " is not a positive multiple of 32");
  if (misaligned(x) || misaligned(y) || misaligned(W.data))
    arg_fail("cuda::matmul: x, y and the weights must be 16-byte aligned");
  int group_log2 = 0;
  if (W.type == WeightType::Affine) {
    if (W.group != 32 && W.group != 64 && W.group != 128)
      arg_fail("cuda::matmul: affine group " + std::to_string(W.group) + " is not 32, 64 or 128");
    if (W.cols % W.group != 0)
      arg_fail("cuda::matmul: cols " + std::to_string(W.cols) + " not a multiple of the group " +
               std::to_string(W.group));
    group_log2 = floor_log2(W.group / kChunk);
  }
  const WeightArgs args{static_cast<const uint8_t*>(W.data), W.scales, W.biases, W.rows, W.cols, group_log2};
  switch (W.type) {
    case WeightType::BF16: return launch_bits<16>(x, T, args, y);
    case WeightType::Affine:
      switch (W.bits) {
        case 2: return launch_bits<2>(x, T, args, y);
        case 3: return launch_bits<3>(x, T, args, y);
        case 4: return launch_bits<4>(x, T, args, y);
        case 8: return launch_bits<8>(x, T, args, y);
      }
      arg_fail("cuda::matmul: affine bits " + std::to_string(W.bits) + " is not 2, 3, 4 or 8");
    case WeightType::F32: break;
  }
  arg_fail("cuda::matmul: f32 weights are not supported on the GPU (store them as bf16)");
}

}  // namespace ms::cuda
