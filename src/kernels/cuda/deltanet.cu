// Gated DeltaNet kernels: the causal conv1d + SiLU with its carried state, and the gated delta
// rule run as its recurrence token by token (the chunked prefill form is not done here).
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

// One thread per channel, walking the tokens: xx = state ++ x, out[t] = silu(Σ_j w[j]·xx[t+j]);
// then state = the last K-1 inputs, written oldest first so that no unread value is overwritten.
__global__ void conv1d_silu_kernel(const float* x, int T, int C, const float* w, int K, float* state, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int H = K - 1;
  const float* wc = w + size_t(c) * K;
  float* st = state + size_t(c) * H;
  auto xx = [&](int u) { return u < H ? st[u] : x[size_t(u - H) * C + c]; };
  for (int t = 0; t < T; ++t) {
    float acc = 0.f;
    for (int j = 0; j < K; ++j) acc += wc[j] * xx(t + j);
    out[size_t(t) * C + c] = silu(acc);
  }
  for (int j = 0; j < H; ++j) st[j] = xx(T + j);
}

// One thread per column j of a value head's state S [dk, dv]: the update of column j needs only
// k, q (staged in shared memory per token) and S[:, j]. Per token, in the reference's order:
// S *= exp(g); kv = kᵀS; delta = (v - kv)·beta; S += k deltaᵀ; o = qᵀS.
__global__ void delta_rule_kernel(const float* q, const float* k, const float* v, const float* g,
                                  const float* beta, int T, int n_k_heads, int n_v_heads, int dk, int dv,
                                  float* state, float* out) {
  extern __shared__ float qk[];  // q_t [dk], k_t [dk]
  const int h = blockIdx.x, kh = h / (n_v_heads / n_k_heads);
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  float* S = state + size_t(h) * dk * dv + j;
  for (int t = 0; t < T; ++t) {
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      qk[i] = q[(size_t(t) * n_k_heads + kh) * dk + i];
      qk[dk + i] = k[(size_t(t) * n_k_heads + kh) * dk + i];
    }
    __syncthreads();
    if (j < dv) {
      const float decay = expf(g[size_t(t) * n_v_heads + h]);
      float kv = 0.f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[size_t(i) * dv] * decay;
        S[size_t(i) * dv] = s;
        kv += qk[dk + i] * s;
      }
      const float delta = (v[(size_t(t) * n_v_heads + h) * dv + j] - kv) * beta[size_t(t) * n_v_heads + h];
      float o = 0.f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[size_t(i) * dv] + qk[dk + i] * delta;
        S[size_t(i) * dv] = s;
        o += qk[i] * s;
      }
      out[(size_t(t) * n_v_heads + h) * dv + j] = o;
    }
    __syncthreads();  // before the next token's q, k replace these
  }
}

}  // namespace

void causal_conv1d_silu(const float* x, int T, int C, const float* w, int K, float* state, float* out) {
  if (K < 1) arg_fail("cuda::causal_conv1d_silu: kernel size " + std::to_string(K) + " < 1");
  if (T <= 0 || C <= 0) return;
  conv1d_silu_kernel<<<unsigned((C + 127) / 128), 128>>>(x, T, C, w, K, state, out);
  CUDA_CHECK_LAUNCH();
}

void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                      int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out) {
  if (n_k_heads <= 0 || n_v_heads <= 0 || n_v_heads % n_k_heads != 0)
    arg_fail("cuda::gated_delta_rule: n_v_heads " + std::to_string(n_v_heads) +
             " is not a positive multiple of n_k_heads " + std::to_string(n_k_heads));
  if (T <= 0) return;
  const int threads = 128;
  const dim3 grid(unsigned(n_v_heads), unsigned((dv + threads - 1) / threads));
  delta_rule_kernel<<<grid, threads, 2 * size_t(dk) * sizeof(float)>>>(q, k, v, g, beta, T, n_k_heads, n_v_heads,
                                                                       dk, dv, state, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ms::cuda
