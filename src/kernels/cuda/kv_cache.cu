// The KV cache's formats on the GPU (quant/kv_quant.h): rows of keys or values rotated and encoded
// into a cache (kv_store, kv_encode's arithmetic: a half bias and scale per group, the nearest
// code), and a head's rotation applied to or undone on rows of activations (kv_rotate: the
// queries over rotated keys, the output over rotated values). A block per row; its values in
// shared memory while they rotate.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kv_cache.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHd = 1024;
constexpr float kHalfMax = 65504.f;

// x (hd values in shared memory) ← R·x, or Rᵀ·x where `inverse` (quant/kv_quant.h, KvRotator).
__device__ void rotate_row(float* x, float* tmp, const KvRotationView& r, int hd, bool inverse) {
  if (r.kind == KvRotation::So4) {
    for (int b = threadIdx.x; b < hd / 4; b += blockDim.x) {
      const float* m = r.blocks + size_t(b) * 16;
      const float in[4] = {x[4 * b], x[4 * b + 1], x[4 * b + 2], x[4 * b + 3]};
      for (int i = 0; i < 4; ++i) {  // KvRotator's sums in its order, each product rounded (no FMA)
        const int s = inverse ? 4 : 1, at = inverse ? i : 4 * i;
        float acc = __fmul_rn(m[at], in[0]);
        for (int j = 1; j < 4; ++j) acc = __fadd_rn(acc, __fmul_rn(m[at + j * s], in[j]));
        tmp[4 * b + i] = acc;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] = tmp[i];
    __syncthreads();
    return;
  }
  if (r.kind != KvRotation::Hadamard) return;
  if (!inverse)
    for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] *= r.signs[i];
  __syncthreads();
  for (int h = 1; h < hd; h *= 2) {  // the butterflies of one stage, a pair a thread
    for (int p = threadIdx.x; p < hd / 2; p += blockDim.x) {
      const int j = (p / h) * 2 * h + p % h;
      const float a = x[j], b = x[j + h];
      x[j] = a + b;
      x[j + h] = a - b;
    }
    __syncthreads();
  }
  const float norm = 1.f / sqrtf(float(hd));
  for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] *= inverse ? norm * r.signs[i] : norm;
  __syncthreads();
}

// Block (kvh, t): row t's head kvh of rows [T, n_kv, hd], rotated where r asks, encoded into the
// cache row of position pos + t.
__global__ void __launch_bounds__(kThreads) kv_store_kernel(const float* rows, int n_kv, int hd, KvSideView s,
                                                            KvRotationView r, uint8_t* cache, int pos0,
                                                            const int* pos_on_device) {
  start_after_kernel_before();  // launched by launch_after
  __shared__ float x[kMaxHd], tmp[kMaxHd];
  __shared__ float scale[kMaxHd / 32], bias[kMaxHd / 32];
  __shared__ uint8_t codes[kMaxHd];
  const int kvh = blockIdx.x, t = blockIdx.y;
  const int pos = (pos_on_device ? *pos_on_device : pos0) + t;
  const float* src = rows + (size_t(t) * n_kv + kvh) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] = src[i];
  __syncthreads();
  rotate_row(x, tmp, r, hd, false);
  uint8_t* dst = cache + (size_t(pos) * n_kv + kvh) * s.row_bytes;
  if (s.bits == 32) {
    for (int i = threadIdx.x; i < hd; i += blockDim.x) reinterpret_cast<float*>(dst)[i] = x[i];
    return;
  }
  if (s.bits == 16) {
    for (int i = threadIdx.x; i < hd; i += blockDim.x) reinterpret_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(x[i]);
    return;
  }
  const int groups = hd / s.group, qmax = (1 << s.bits) - 1;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float lo = x[g * s.group], hi = lo;
    for (int i = 1; i < s.group; ++i) lo = fminf(lo, x[g * s.group + i]), hi = fmaxf(hi, x[g * s.group + i]);
    const __half hb = __float2half_rn(fminf(fmaxf(lo, -kHalfMax), kHalfMax));
    const float b = __half2float(hb);
    const __half hs = __float2half_rn(fminf(fmaxf(__fdiv_rn(hi - b, float(qmax)), -kHalfMax), kHalfMax));
    scale[g] = __half2float(hs);
    bias[g] = b;
    __half* params = reinterpret_cast<__half*>(dst + s.code_bytes);
    params[g] = hs;
    params[groups + g] = hb;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    const int g = i / s.group;
    const float level = scale[g] > 0.f ? rintf(__fdiv_rn(x[i] - bias[g], scale[g])) : 0.f;
    codes[i] = uint8_t(fminf(fmaxf(level, 0.f), float(qmax)));
  }
  __syncthreads();
  for (int j = threadIdx.x; j < hd / 8; j += blockDim.x) {  // eight codes into `bits` bytes
    unsigned long long w = 0;
    for (int u = 0; u < 8; ++u) w |= (unsigned long long)codes[8 * j + u] << (u * s.bits);
    for (int b = 0; b < s.bits; ++b) dst[size_t(j) * s.bits + b] = uint8_t(w >> (8 * b));
  }
}

__global__ void __launch_bounds__(kThreads) kv_rotate_kernel(float* x, int hd, KvRotationView r, bool inverse,
                                                             const float* gate) {
  start_after_kernel_before();  // launched by launch_after
  __shared__ float v[kMaxHd], tmp[kMaxHd];
  float* row = x + size_t(blockIdx.x) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = row[i];
  __syncthreads();
  rotate_row(v, tmp, r, hd, inverse);
  const float* g = gate ? gate + size_t(blockIdx.x) * hd : nullptr;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) row[i] = g ? v[i] * sigmoid(g[i]) : v[i];
}

void check_hd(int hd, const char* what) {
  if (hd <= 0 || hd > kMaxHd || hd % 8 != 0)
    arg_fail(std::string(what) + ": head_dim " + std::to_string(hd) + " is not a multiple of 8 up to 1024");
}

}  // namespace

KvSideView kv_side_view(KvSide s, int hd) {
  return {s.bits, s.group, int(s.row_bytes(hd)), s.quantized() ? hd * s.bits / 8 : 0};
}

void kv_store(const float* rows, int T, int n_kv, int hd, KvSide side, const KvRotationView& r, uint8_t* cache,
              int pos0, const int* pos_on_device) {
  check_hd(hd, "cuda::kv_store");
  if (T <= 0) return;
  launch_after(kv_store_kernel, dim3(unsigned(n_kv), unsigned(T)), kThreads, 0, rows, n_kv, hd, kv_side_view(side, hd),
               r, cache, pos0, pos_on_device);
  CUDA_CHECK_LAUNCH();
}

void kv_rotate(float* x, size_t rows, int hd, const KvRotationView& r, bool inverse, const float* gate) {
  check_hd(hd, "cuda::kv_rotate");
  if (rows == 0 || (r.kind == KvRotation::None && !gate)) return;
  launch_after(kv_rotate_kernel, unsigned(rows), kThreads, 0, x, hd, r, inverse, gate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ms::cuda
