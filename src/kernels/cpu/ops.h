#pragma once
// CPU kernels: float32 activations, weights as stored. Row-major; T = tokens in the batch.
#include <cmath>
#include <cstdint>

#include "kernels/weights.h"
#include "quant/kv_quant.h"

namespace ms::cpu {

// y[T, W.rows] = x[T, W.cols] · Wᵀ.
void matmul(const float* x, int T, const Mat& W, float* y);

// out = x * rsqrt(mean(x²) + eps) * (offset + w), per row of `dim`.
// offset 0: Qwen3's RMSNorm; offset 1: Qwen3-Next's zero-centred one.
void rmsnorm(const float* x, int rows, int dim, const float* w, float offset, float eps, float* out);

// Rotary embedding (rotate-half layout) on the first `rot_dim` dims of each head of x
// [T, heads, head_dim]; token t sits at position pos0 + t.
void rope(float* x, int T, int heads, int head_dim, int rot_dim, int pos0, double theta);

// Causal attention of T new queries (positions pos0..pos0+T-1) over a cache holding
// positions 0..pos0+T-1. q [T, n_heads, hd]; k, v [>= pos0+T, n_kv, hd]; out [T, n_heads, hd].
// A token's output is the same bits whatever T is and however many threads run it
// (kernels/cpu/attention.cpp).
void attention(const float* q, const float* k, const float* v, int T, int pos0, int n_heads, int n_kv, int hd,
               float* out);
// One side of a KV cache as attention reads it: a row of `side` (quant/kv_quant.h) per position
// and KV head, [>= pos0+T, n_kv]. Quantized and bf16 rows are decoded a chunk of positions at a
// time into the chunk's scratch (kv_decode's values, the scale·q + bias fused); float32 rows are
// read in place, so that the float overload above is this one's bits.
struct KvRows {
  const uint8_t* data;
  KvSide side;
};
void attention(const float* q, KvRows k, KvRows v, int T, int pos0, int n_heads, int n_kv, int hd, float* out);

// 1 / (1 + exp(-v)), as the CUDA kernels' sigmoid (kernels/cuda/reduce.cuh) writes it.
inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// In-place softmax over each row, its sum taken in warp_order_sum's order.
void softmax(float* x, int rows, int n);

// Σ v[0..n) in the order one GPU warp sums it: lane l adds v[l], v[l + 32], ... in turn (from 0),
// then the 32 partial sums combine pairwise as a butterfly of shuffles does (lane l adds lane
// l xor 16's, then xor 8's, ... xor 1's). The router's softmax sums so on both CPU and GPU
// (cuda::route_topk), so that its probabilities and the routed ids are the same bits, and the
// GPU's sum is a few dozen adds deep instead of n.
float warp_order_sum(const float* v, int n);

// Indices of the k largest values of x[n], largest first (ties: lower index first).
void top_k(const float* x, int n, int k, int* idx);

}  // namespace ms::cpu
