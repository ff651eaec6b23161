#pragma once
// The integer dot product of kernels/int_dot.h on the CPU: the reference cuda::int_gemm is tested
// against bit for bit, and the CPU's own prefill form of the layouts it takes.
#include <cstdint>
#include <span>
#include <vector>

#include "quant/affine.h"

namespace ms::cpu {

// x [n, cols] split into units of `unit` values as int_dot.h defines: X [n, cols] in column order,
// 2^e and Σx [n, cols / unit].
struct IntSplit {
  std::vector<int32_t> X;
  std::vector<float> pow2, xsum;
  int rows = 0, cols = 0, unit = 0;
};
IntSplit int_split(const float* x, int n, int cols, int unit);

// Whether W's layout runs on int_matmul (int_dot::layout_supported).
bool int_matmul_supported(const QuantMat& W);

// y [T, W.rows] = x [T, W.cols] · Wᵀ as int_dot.h defines it; runtime-dispatched SIMD (AVX-512,
// AVX2, portable), threaded over rows. Throws naming the layout where int_matmul_supported is false.
void int_matmul(const float* x, int T, const QuantMat& W, float* y);

// ys[i] [T, rows] = x · Ws[i]ᵀ for matrices of one shape and layout (a layer's gates and ups):
// x split once, and all their rows shared out over the threads at once. Bit-identical to
// int_matmul on each. Throws naming the layouts where they differ or have no kernel.
void int_matmul_each(const float* x, int T, std::span<const QuantMat> Ws, std::span<float* const> ys);

// The SIMD target int_matmul dispatches to on this CPU ("AVX3", "AVX2", "SCALAR" or "EMU128").
const char* int_matmul_target();

}  // namespace ms::cpu
