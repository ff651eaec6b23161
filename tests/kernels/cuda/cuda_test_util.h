#pragma once
// Shared pieces of the CUDA kernel tests: skipping without a GPU, random inputs, device copies,
// and one line per checked case with its error, for the record of a GPU run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_support.h"

#include "kernels/cuda/device.h"
#include "kernels/cuda/device_memory.h"

#define MS_REQUIRE_CUDA()              \
  if (!::ms::cuda::cuda_available()) \
  GTEST_SKIP() << "no CUDA device: the CUDA kernel tests run only on a machine with an NVIDIA GPU"

namespace ms::cuda::test {

using Vec = std::vector<float>;

using ::ms::test::Rng;

inline float max_abs(const Vec& a) {
  float m = 0.0f;
  for (float x : a) m = std::max(m, std::abs(x));
  return m;
}

inline float max_abs_diff(const Vec& a, const Vec& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Runs the kernel on device copies of `in` (one buffer per vector) and returns every buffer
// afterwards, so in-place and output buffers come back alike. The tests' device memory is
// taken with DeviceAlloc::Now, as cudaMalloc'ed buffers were before there was one type.
inline DeviceArray<float> dev(const Vec& v) { return DeviceArray<float>::from(v, DeviceAlloc::Now); }
inline Vec host(const DeviceArray<float>& b) {
  synchronize();
  return b.to_vector();
}
// The bits of device floats, to compare results exactly (NaN and -0 included).
inline std::vector<uint32_t> bits(const DeviceArray<float>& b) {
  const Vec v = b.to_vector();
  std::vector<uint32_t> u(v.size());
  if (!v.empty()) std::memcpy(u.data(), v.data(), v.size() * sizeof(float));
  return u;
}

// The error of one case, printed for the record ("[cuda-err] kernel case: max error ... tolerance ...").
inline void record(const std::string& kernel, const std::string& what, double err, double tol) {
  std::printf("[cuda-err] %-18s %-44s max err %.3g (tolerance %.3g)\n", kernel.c_str(), what.c_str(), err, tol);
}

}  // namespace ms::cuda::test
