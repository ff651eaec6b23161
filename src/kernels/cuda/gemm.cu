// cuda::matmul for prefill: W dequantized to float32 in tiles of rows, each tile one cuBLAS SGEMM.
// The custom kernel reads each weight chunk once per 4 tokens, so for hundreds of tokens it is
// compute-bound on its decoding and FMA loop; an SGEMM reuses each weight across all T tokens from
// shared memory and registers. Plain FP32 (no TF32): the forward must stay float32-accurate.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

constexpr int kUnit = 8;  // weights a thread dequantizes: BITS whole bytes for every width

#define CUBLAS_CHECK(call)                                                          \
  do {                                                                              \
    const cublasStatus_t ms_cublas_st_ = (call);                                    \
    if (ms_cublas_st_ != CUBLAS_STATUS_SUCCESS) cublas_fail(__FILE__, __LINE__, #call, ms_cublas_st_); \
  } while (0)

// cuBLAS, loaded when the first GEMM runs instead of linked: its libraries (hundreds of MB) would
// otherwise be mapped into every process at start, CPU-only and memory-capped runs too.
struct Cublas {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasGetStatusName) status_name;
};

const Cublas& cublas() {
  static const Cublas api = [] {
    void* lib = nullptr;
    for (const char* name : {"libcublas.so.13", MOESTREAM_CUBLAS_DIR "/libcublas.so.13", "libcublas.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) arg_fail(std::string("cannot load cuBLAS (libcublas.so.13) for prefill matmuls: ") + dlerror());
    auto sym = [&](const char* name) {
      void* p = dlsym(lib, name);
      if (!p) arg_fail(std::string("cuBLAS has no ") + name + ": " + dlerror());
      return p;
    };
    return Cublas{reinterpret_cast<decltype(&cublasCreate_v2)>(sym("cublasCreate_v2")),
                  reinterpret_cast<decltype(&cublasSetMathMode)>(sym("cublasSetMathMode")),
                  reinterpret_cast<decltype(&cublasSetStream_v2)>(sym("cublasSetStream_v2")),
                  reinterpret_cast<decltype(&cublasSgemm_v2)>(sym("cublasSgemm_v2")),
                  reinterpret_cast<decltype(&cublasGetStatusName)>(sym("cublasGetStatusName"))};
  }();
  return api;
}

[[noreturn]] void cublas_fail(const char* file, int line, const char* call, cublasStatus_t st) {
  arg_fail(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " + cublas().status_name(st));
}

// The unit of 8 weights starting at weight 8u: its BITS bytes as one little-endian word.
template <int BITS>
__device__ __forceinline__ uint64_t load_unit(const uint8_t* q, size_t u) {
  const uint8_t* p = q + u * BITS;
  if constexpr (BITS == 8) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    return uint64_t(v.x) | uint64_t(v.y) << 32;
  } else if constexpr (BITS == 4) {
    return __ldg(reinterpret_cast<const uint32_t*>(p));
  } else if constexpr (BITS == 2) {
    return __ldg(reinterpret_cast<const uint16_t*>(p));
  } else {  // 3, 5 or 6 bytes, byte-aligned only
    uint64_t v = 0;
#pragma unroll
    for (int i = 0; i < BITS; ++i) v |= uint64_t(__ldg(p + i)) << (8 * i);
    return v;
  }
}

// out[i] = W's weight i as float32, for the n/8 units of a tile (rows consecutive in memory, the
// tile starting at a row, so its weights, q stream and groups run on from its first).
template <int BITS>
__global__ void dequantize_kernel(const uint8_t* __restrict__ q, const uint16_t* __restrict__ scales,
                                  const uint16_t* __restrict__ biases, ScaleType scale_type, int units_per_group_log2,
                                  size_t units, float* __restrict__ out) {
  for (size_t u = blockIdx.x * size_t(blockDim.x) + threadIdx.x; u < units; u += size_t(gridDim.x) * blockDim.x) {
    float v[kUnit];
    if constexpr (BITS == 16) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(q) + u);
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) v[2 * i] = __uint_as_float(words[i] << 16), v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    } else {
      const uint64_t w = load_unit<BITS>(q, u);
      const size_t g = u >> units_per_group_log2;
      const float s = scale_at(scales, uint32_t(g), scale_type), b = scale_at(biases, uint32_t(g), scale_type);
#pragma unroll
      for (int i = 0; i < kUnit; ++i) {
        const float code = float(uint32_t(w >> (i * BITS)) & ((1u << BITS) - 1));
        // dequantize_row's float arithmetic, unfused (s·q is exact anyway: 8 by at most 8 significant bits).
        v[i] = __fadd_rn(__fmul_rn(s, code), b);
      }
    }
    float4* o = reinterpret_cast<float4*>(out + u * kUnit);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

template <int BITS>
void dequantize(const Mat& W, int r0, int rows, float* out) {
  const size_t units = size_t(rows) * size_t(W.cols) / kUnit;
  const size_t row_units = size_t(W.cols) / kUnit;
  const auto* q = static_cast<const uint8_t*>(W.data) + size_t(r0) * row_units * (BITS == 16 ? 16 : BITS);
  const uint16_t *scales = nullptr, *biases = nullptr;
  int units_per_group_log2 = 0;
  if constexpr (BITS != 16) {
    const size_t groups = size_t(W.cols / W.group);
    scales = scale_entry(W.scales, size_t(r0) * groups, W.scale_type);
    biases = scale_entry(W.biases, size_t(r0) * groups, W.scale_type);
    while ((kUnit << units_per_group_log2) < W.group) ++units_per_group_log2;
  }
  constexpr int threads = 256;
  const unsigned blocks = unsigned(std::min<size_t>((units + threads - 1) / threads, 65535));
  dequantize_kernel<BITS><<<blocks, threads, 0, compute_stream()>>>(q, scales, biases, W.scale_type,
                                                                     units_per_group_log2, units, out);
  CUDA_CHECK_LAUNCH();
}

void dequantize_tile(const Mat& W, int r0, int rows, float* out) {
  if (W.type == WeightType::BF16) return dequantize<16>(W, r0, rows, out);
  with_bits<2, 3, 4, 5, 6, 8>(W.bits, "cuda::matmul", [&](auto B) { dequantize<B>(W, r0, rows, out); });
}

// The same checks as matmul_direct, so that matmul throws alike whichever form T picks.

// The current device's handle, made on first use, in the default math mode (FP32 SGEMMs stay
// FP32: TF32 only where asked for) on the compute stream. Never destroyed:
// at exit the CUDA context may already be gone.
cublasHandle_t handle_locked() {
  static std::map<int, cublasHandle_t> handles;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cublasHandle_t& h = handles[dev];
  if (!h) {
    CUBLAS_CHECK(cublas().create(&h));
    CUBLAS_CHECK(cublas().set_math_mode(h, CUBLAS_DEFAULT_MATH));
    CUBLAS_CHECK(cublas().set_stream(h, compute_stream()));
  }
  return h;
}

}  // namespace

void matmul_gemm(const float* x, int T, const Mat& W, float* y, size_t max_scratch_bytes) {
  check_matmul_args(x, W, y);
  if (T <= 0 || W.rows <= 0) return;
  const size_t row_bytes = size_t(W.cols) * sizeof(float);
  const int tile = int(std::clamp<size_t>(max_scratch_bytes / row_bytes, 1, size_t(W.rows)));
  static std::mutex mu;  // one scratch: the tiles of concurrent callers must not interleave
  static DeviceArray<float> scratch;
  std::lock_guard<std::mutex> lock(mu);
  const cublasHandle_t h = handle_locked();
  const float one = 1.0f, zero = 0.0f;
  if (W.type == WeightType::F32) {  // already float32: one SGEMM on the weights themselves, no scratch
    CUBLAS_CHECK(cublas().sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, W.rows, T, W.cols, &one, static_cast<const float*>(W.data),
                                W.cols, x, W.cols, &zero, y, W.rows));
    return;
  }
  const size_t floats = size_t(tile) * size_t(W.cols);  // tile rows of W, dequantized
  if (scratch.size() < floats)
    scratch = DeviceArray<float>(floats, DeviceAlloc::Now);  // frees the old one after the GPU is done with it
  for (int r0 = 0; r0 < W.rows; r0 += tile) {
    const int rows = std::min(tile, W.rows - r0);
    dequantize_tile(W, r0, rows, scratch.data());
    // Column-major, cuBLAS' view: y [rows of W, T] with leading dimension W.rows holds y[T, W.rows];
    // the tile [cols, rows] transposed is W's rows; x [cols, T] is x[T, cols].
    CUBLAS_CHECK(cublas().sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, W.cols, &one, scratch.data(), W.cols, x,
                             W.cols, &zero, y + r0, W.rows));
  }
}

}  // namespace ms::cuda
