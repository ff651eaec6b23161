#pragma once
// The two forms of cuda::matmul (kernels/cuda/ops.h), named so that tests and benchmarks can run
// each on any T. Same arguments, checks and results as matmul; device pointers. float32 weights
// (a GGUF's routers) take the bf16 threshold and need no dequantizing.
// Plain C++: no CUDA headers needed to include this.
#include <cstddef>

#include "kernels/weights.h"

namespace ms::cuda {

// matmul runs matmul_gemm from gemm_min_tokens(W) tokens on, matmul_direct below it: the
// crossovers of bench_cuda_matvec's "gemm" sweep on the H200, where affine weights (on the integer
// tensor cores, 4 tokens a block) stay direct longer than bf16
// (docs/PERFORMANCE.md#cuda-prefill-matmul).
inline constexpr int kGemmMinTokensBf16 = 32;
inline constexpr int kGemmMinTokensAffine = 112;
inline int gemm_min_tokens(const Mat& W) {
  return W.type == WeightType::Affine ? kGemmMinTokensAffine : kGemmMinTokensBf16;
}

// Device scratch matmul_gemm dequantizes into by default: 64 MiB, 8192 rows of the 151936 x 2048
// lm_head or 2048 rows of a dense 8192 x 8192 a tile.
inline constexpr size_t kGemmScratchBytes = size_t(64) << 20;

// Throws naming what cuda::matmul cannot take: the shape, alignment, dtype, group or bits of W.
void check_matmul_args(const float* x, const Mat& W, const float* y);

// The custom kernel (matmul.cu): each weight chunk read once per 4 tokens; what decode needs.
void matmul_direct(const float* x, int T, const Mat& W, float* y);

// Prefill through cuBLAS: W dequantized to float32 (exactly the CPU's values, scale·q + bias) in
// tiles of rows that fit max_scratch_bytes, each tile one FP32 SGEMM (no TF32) into y's columns.
// Deterministic for a given shape and budget; holds the scratch and a cuBLAS handle between calls.
void matmul_gemm(const float* x, int T, const Mat& W, float* y, size_t max_scratch_bytes = kGemmScratchBytes);

}  // namespace ms::cuda
