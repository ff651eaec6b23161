// y = x · Wᵀ on the GPU for bf16 and affine-quantized (2/3/4/8-bit) weights: one kernel,
// specialised by BITS (16 = bf16), over the chunk decoding of weight_dot.cuh. The activations of
// TT tokens are staged in shared memory once per block, and blocks loop over row sets (a grid of
// what fits on the chip), so that the weights, read once per TT tokens, are what streams from memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/weight_dot.cuh"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 4;  // tokens per block when T > 1

template <int BITS, int TT>
__global__ void __launch_bounds__(kThreads) matmul_kernel(const float* __restrict__ x, int T, WeightArgs W,
                                                          float* __restrict__ y, int split_log2) {
  constexpr int R = kRowsPerThread<BITS>;
  extern __shared__ float4 smem[];
  const int nchunks = W.cols / kChunk;
  float4* xs = smem;                                                                  // [TT][nchunks][kChunkSlots]
  float* xsum = reinterpret_cast<float*>(smem + size_t(TT) * nchunks * kChunkSlots);  // [TT][nchunks]
  const int t0 = blockIdx.y * TT;
  stage_activations<BITS, kThreads>(x + size_t(t0) * W.cols, TT, T - t0, W.cols, xs, xsum);

  const int split = 1 << split_log2, lane = threadIdx.x & (split - 1), grp = threadIdx.x >> split_log2;
  const int groups = kThreads >> split_log2;
  const int nsets = (W.rows + groups * R - 1) / (groups * R);
  const WeightArgs Ws[1] = {W};
  for (int set = blockIdx.x; set < nsets; set += gridDim.x) {  // uniform over the block
    const int r0 = (set * groups + grp) * R;
    float acc[1][R][TT] = {};
    dot_rows<BITS, TT, 1>(xs, xsum, Ws, r0, lane, split, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < TT; ++t) acc[0][r][t] = sum_lanes(acc[0][r][t], split);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TT; ++t)
          if (r0 + r < W.rows && t0 + t < T) y[size_t(t0 + t) * W.rows + size_t(r0 + r)] = acc[0][r][t];
    }
  }
}

// Shared memory a block needs for TT tokens of `cols` activations (and their chunk sums).
size_t smem_bytes(int TT, int cols) {
  return size_t(TT) * size_t(cols / kChunk) * (kChunkSlots * sizeof(float4) + sizeof(float));
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

void check_matmul_args(const float* x, const Mat& W, const float* y) {
  if (W.cols <= 0 || W.cols % kChunk != 0)
    arg_fail("cuda::matmul: cols " + std::to_string(W.cols) + " is not a positive multiple of 32");
  if (misaligned(x) || misaligned(y) || misaligned(W.data))
    arg_fail("cuda::matmul: x, y and the weights must be 16-byte aligned");
  if (W.type == WeightType::F32) arg_fail("cuda::matmul: f32 weights are not supported on the GPU (store them as bf16)");
  if (W.type != WeightType::Affine) return;
  if (W.group != 32 && W.group != 64 && W.group != 128)
    arg_fail("cuda::matmul: affine group " + std::to_string(W.group) + " is not 32, 64 or 128");
  if (W.cols % W.group != 0)
    arg_fail("cuda::matmul: cols " + std::to_string(W.cols) + " not a multiple of the group " + std::to_string(W.group));
  if (W.bits != 2 && W.bits != 3 && W.bits != 4 && W.bits != 8)
    arg_fail("cuda::matmul: affine bits " + std::to_string(W.bits) + " is not 2, 3, 4 or 8");
}

void matmul_direct(const float* x, int T, const Mat& W, float* y) {
  if (T <= 0 || W.rows <= 0) return;
  check_matmul_args(x, W, y);
  const int group_log2 = W.type == WeightType::Affine ? floor_log2(W.group / kChunk) : 0;
  const WeightArgs args{static_cast<const uint8_t*>(W.data), W.scales, W.biases, W.rows, W.cols, group_log2};
  if (W.type == WeightType::BF16) return launch_bits<16>(x, T, args, y);
  switch (W.bits) {
    case 2: return launch_bits<2>(x, T, args, y);
    case 3: return launch_bits<3>(x, T, args, y);
    case 4: return launch_bits<4>(x, T, args, y);
    default: return launch_bits<8>(x, T, args, y);
  }
}

void matmul(const float* x, int T, const Mat& W, float* y) {
  if (T >= gemm_min_tokens(W)) return matmul_gemm(x, T, W, y);
  matmul_direct(x, T, W, y);
}

}  // namespace ms::cuda
