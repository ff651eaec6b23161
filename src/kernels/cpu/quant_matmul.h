#pragma once
// Matmul on affine-quantized weights (quant/affine.h), computed on the packed bit streams:
// the weights are never dequantized as a whole.
#include <cstddef>

#include "quant/affine.h"

namespace ms::cpu {

// y[t, r] = Σ_c x[t, c] · deq(W)[r, c] for t < T; x [T, W.cols], y [T, W.rows], row-major.
// T = 1 is the decode matvec; for small T (prefill, verify) each unpacked row is reused by
// all T tokens. Runtime-dispatched SIMD (AVX-512, AVX2, portable fallback), threaded over rows.
void matmul_quant(const float* x, int T, const QuantMat& W, float* y);

// One matmul of a batch: y [T, W.rows] = x [T, W.cols] · deq(W)ᵀ.
struct QuantJob {
  const float* x;
  int T;
  QuantMat W;
  float* y;
};

// Every job as matmul_quant computes it (the same bits), in one parallel region: the rows of
// all jobs are split together, so a layer's small matrices (its experts) wait at one barrier,
// not one each. Jobs reading the same x share its permutation.
void matmul_quant_batch(const QuantJob* jobs, size_t n);

// The SIMD target matmul_quant dispatches to on this CPU ("AVX3", "AVX2", "SCALAR" or "EMU128").
const char* matmul_quant_target();

}  // namespace ms::cpu
