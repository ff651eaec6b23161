// y = x · Wᵀ on the GPU for bf16 and affine-quantized (2/3/4/8-bit) weights: one kernel,
// specialised by BITS (16 = bf16). A thread decodes a chunk of 32 consecutive weights of a row
// (BITS 32-bit words, all in one quantization group since groups are multiples of 32) for R rows
// at once, so that each activation it reads from shared memory serves R rows; a group of up to 32
// threads splits a row's chunks and sums by shuffles. The activations of TT tokens are staged in
// shared memory once per block, and blocks loop over row sets (a grid of what fits on the chip),
// so that the weights, read once per TT tokens, are what streams from memory.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
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

// Weights a step of the inner loop decodes: one 32-bit word of 2-bit codes, 8 weights otherwise.
template <int BITS>
constexpr int kStep = BITS == 2 ? 16 : 8;

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
  } else {  // bf16, and 3-bit codes that straddle words
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = chunk_value<BITS>(w, 8 * st + j);
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
      constexpr int S = kStep<BITS>;
      float dot[R][TT] = {};
#pragma unroll
      for (int st = 0; st < kChunk / S; ++st) {
        float4 xv[TT][S / 4];
#pragma unroll
        for (int t = 0; t < TT; ++t)
#pragma unroll
          for (int j = 0; j < S / 4; ++j) xv[t][j] = xs[(t * nchunks + c) * kChunkSlots + st * (S / 4) + j];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float v[S];
          decode_step<BITS>(w[r], st, v);
#pragma unroll
          for (int t = 0; t < TT; ++t)
#pragma unroll
            for (int j = 0; j < S / 4; ++j) {
              dot[r][t] = fmaf(v[4 * j], xv[t][j].x, dot[r][t]);
              dot[r][t] = fmaf(v[4 * j + 1], xv[t][j].y, dot[r][t]);
              dot[r][t] = fmaf(v[4 * j + 2], xv[t][j].z, dot[r][t]);
              dot[r][t] = fmaf(v[4 * j + 3], xv[t][j].w, dot[r][t]);
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
  // Blocks resident per multiprocessor, for the last shared-memory size (asking costs as much as a launch).
  static std::mutex mu;
  static size_t cached_smem = 0;
  static int cached_per_sm = 0;
  int per_sm;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (cached_smem != smem) {
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cached_per_sm, kernel, kThreads, smem));
      cached_smem = smem;
    }
    per_sm = cached_per_sm;
  }
  if ((T + TT - 1) / TT > 65535) arg_fail("cuda::matmul: T " + std::to_string(T) + " tokens in one call; split the batch");
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
