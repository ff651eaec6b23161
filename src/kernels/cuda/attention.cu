// Causal GQA attention over the KV cache: one block per (query token, head), its warps taking
// the cache positions in turn with an online softmax each, merged at the end. Each lane holds
// head_dim / 32 of the query and output dims (strided by 32, so cache rows load coalesced).
// A gated layer's sigmoid(gate) multiplies the output as it is stored, instead of in a launch of
// its own.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPerLane = 8;  // head_dim up to 256

__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const float* q, const float* k, const float* v,
                                                                 int pos0, const int* pos_on_device, int n_heads,
                                                                 int n_kv, int hd, const float* gate,
                                                                 float* out) {
  start_after_kernel_before();  // launched by launch_after
  __shared__ float acc_s[kWarps][kMaxPerLane * 32];
  __shared__ float m_s[kWarps], l_s[kWarps];
  const int t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int kvh = h / (n_heads / n_kv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int per_lane = hd / 32, len = (pos_on_device ? *pos_on_device : pos0) + t + 1;
  const float scale = 1.0f / sqrtf(float(hd));
  const float* qv = q + (size_t(t) * n_heads + h) * hd;

  float qr[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) qr[i] = i < per_lane ? qv[i * 32 + lane] : 0.f, acc[i] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int s = warp; s < len; s += kWarps) {
    const float* kr = k + (size_t(s) * n_kv + kvh) * hd;
    const float* vr = v + (size_t(s) * n_kv + kvh) * hd;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (i < per_lane) dot = fmaf(qr[i], kr[i * 32 + lane], dot);
    const float score = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new), p = expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (i < per_lane) acc[i] = fmaf(p, vr[i * 32 + lane], acc[i] * corr);
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (i < per_lane) acc_s[warp][i * 32 + lane] = acc[i];
  if (lane == 0) m_s[warp] = m, l_s[warp] = l;
  __syncthreads();

  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w]);
  float L = 0.f;
  for (int w = 0; w < kWarps; ++w) L += l_s[w] * expf(m_s[w] - M);  // a warp with no positions: l 0
  const size_t row = (size_t(t) * n_heads + h) * hd;
  for (int j = threadIdx.x; j < hd; j += kWarps * 32) {
    float sum = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (l_s[w] > 0.f) sum += acc_s[w][j] * expf(m_s[w] - M);
    out[row + j] = gate ? sum / L * sigmoid(gate[row + j]) : sum / L;
  }
}

}  // namespace

void attention(const float* q, const float* k, const float* v, int T, int pos0, int n_heads, int n_kv, int hd,
               float* out, const int* pos_on_device, const float* gate) {
  if (hd <= 0 || hd % 32 != 0 || hd > kMaxPerLane * 32)
    arg_fail("cuda::attention: head_dim " + std::to_string(hd) + " is not a multiple of 32 up to 256");
  if (n_kv <= 0 || n_heads % n_kv != 0)
    arg_fail("cuda::attention: n_heads " + std::to_string(n_heads) + " is not a multiple of n_kv " +
             std::to_string(n_kv));
  if (T <= 0) return;
  launch_after(attention_kernel, unsigned(T * n_heads), kWarps * 32, 0, q, k, v, pos0, pos_on_device, n_heads, n_kv,
               hd, gate, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ms::cuda
