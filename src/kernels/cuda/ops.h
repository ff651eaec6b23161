#pragma once
// CUDA kernels with the CPU kernels' interface (kernels/cpu/ops.h, kernels/cpu/deltanet.h): the
// same arguments and results, every pointer a device pointer (a Mat's data, scales and biases
// too). Calls queue work on the default stream and return; argument errors throw ms::Error.
// Plain C++: no CUDA headers needed to include this.
#include <cstdint>

#include "kernels/weights.h"

namespace ms::cuda {

// y[T, W.rows] = x[T, W.cols] · Wᵀ for BF16 and Affine (2/3/4/8-bit) weights. W.cols must be a
// multiple of 32; x, y and W's buffers 16-byte aligned. T = 1 is the memory-bound decode
// matvec; larger T reuses each weight chunk for 4 tokens at a time.
void matmul(const float* x, int T, const Mat& W, float* y);

void rmsnorm(const float* x, int rows, int dim, const float* w, float offset, float eps, float* out);
void rope(float* x, int T, int heads, int head_dim, int rot_dim, int pos0, double theta);
void attention(const float* q, const float* k, const float* v, int T, int pos0, int n_heads, int n_kv, int hd,
               float* out);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void softmax(float* x, int rows, int n);
// Per row of x [rows, n]: the indices of the k largest values, largest first, ties to the lower
// index (cpu::top_k on each row). idx: [rows, k].
void top_k(const float* x, int rows, int n, int k, int* idx);

// Gated DeltaNet (kernels/cpu/deltanet.h). gated_delta_rule runs the recurrent update token by
// token for any T.
void causal_conv1d_silu(const float* x, int T, int C, const float* w, int K, float* state, float* out);
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                      int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out);
void l2norm_heads(float* x, int rows, int dim, float eps);
void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out);

}  // namespace ms::cuda
