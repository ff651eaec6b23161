#pragma once
// The two forms of cuda::matmul (kernels/cuda/ops.h), named so that tests and benchmarks can run
// each on any T. Same arguments, checks and results as matmul; device pointers.
// Plain C++: no CUDA headers needed to include this.
#include <cstddef>

#include "kernels/weights.h"

namespace ms::cuda {

// matmul runs matmul_gemm from gemm_min_tokens(W) tokens on, matmul_direct below it. Crossovers
// of bench_cuda_matvec's "gemm" sweep on an H200: bf16 at T = 24..32 for 8192 x 8192, 12288 x
// 2048 and 2048 x 4096 (8192², T=32: 436 us direct, 328 us gemm). Affine weights run on the
// integer tensor cores, 4 tokens a block: at T = 96 direct is faster for all four shapes (8192²,
// 533 against 576 us), at T = 128 the SGEMM for 8192² (558 against 708 us) and even for 12288 x
// 2048 (221 us), so the switch is between them; 2048 x 4096 stays faster direct to T = 128 and a
// 512 x 2048 matrix to T = 256 (20 against 27 us).
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
