#include "stream_read.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream.h"

namespace ms::bench {
namespace {

constexpr int kThreads = 512, kUnroll = 4;  // 64 bytes a thread in flight

__global__ void __launch_bounds__(kThreads) stream_read_kernel(const uint4* __restrict__ p, size_t n, uint32_t* out) {
  cuda::grid_dependency_wait();
  const size_t stride = size_t(gridDim.x) * kThreads;
  uint32_t sum = 0;
  size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) sum += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(p + i);
    sum += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (sum == 0x9e3779b9u) *out = sum;
  cuda::grid_dependents_may_start();
}

}  // namespace

double median_ms(const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  fn();
  std::vector<float> runs;
  for (int r = 0; r < 5; ++r) {
    CUDA_CHECK(cudaEventRecord(a, cuda::compute_stream()));
    fn();
    CUDA_CHECK(cudaEventRecord(b, cuda::compute_stream()));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    runs.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(runs.begin(), runs.end());
  return double(runs[2]);
}

double copy_gbps() {
  const size_t bytes = size_t(2) << 30;
  cuda::DeviceArray<unsigned char> src(bytes, cuda::DeviceAlloc::Now), dst(bytes, cuda::DeviceAlloc::Now);
  CUDA_CHECK(cudaMemset(src.data(), 1, bytes));
  const double ms = median_ms([&] {
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, cuda::compute_stream()));
  });
  return 2.0 * double(bytes) / (ms * 1e6);
}

void stream_read(const void* p, size_t bytes, uint32_t* out) {
  static cuda::KernelLimits lim;
  const int resident = cuda::resident_blocks(stream_read_kernel, kThreads, 0, lim, "stream_read", 0);
  const size_t n = bytes / sizeof(uint4), needed = (n + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(needed < size_t(resident) ? needed : size_t(resident));
  cuda::launch_overlapped(stream_read_kernel, lim.overlap, dim3(grid), kThreads, 0, static_cast<const uint4*>(p), n,
                          out);
}

}  // namespace ms::bench
