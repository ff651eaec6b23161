// What a decode step pays on the host per GPU operation: a launch (plain, and with programmatic
// dependent launch as the matvec and expert kernels use), a stream-ordered allocation and free
// pair (what each activation buffer cost before device_alloc reused them), a small pageable copy
// each way. Each is issued back to back with no synchronisation between, so that the host's time
// per call is what bounds a step when the GPU keeps up ("drained": including the wait for the GPU
// at the end). A decode step of Qwen3-Next launched kernel by kernel pays a launch for each of
// about 20 kernels a layer; replayed as a CUDA graph (every expert resident) it pays one a step.
//
//   build/bench/bench_cuda_host_cost
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>

#include "kernels/cuda/check.h"

namespace {

__global__ void empty_kernel(float* p, int n) {
  if (threadIdx.x == 0 && n < 0) p[0] = 1.f;  // never: a launch with arguments and no work
}

__global__ void overlapped_kernel(float* p, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (threadIdx.x == 0 && n < 0) p[0] = 1.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

template <class F>
void report(const char* what, int calls, F&& call) {
  using Clock = std::chrono::steady_clock;
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) call();
  const auto t1 = Clock::now();
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto t2 = Clock::now();
  auto us = [&](auto d) { return std::chrono::duration<double, std::micro>(d).count() / calls; };
  std::printf("%-44s %7.2f us a call on the host, %7.2f drained\n", what, us(t1 - t0), us(t2 - t0));
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  constexpr int kCalls = 20000;
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, 1024));
  report("launch <<<132, 256>>>", kCalls, [&] { empty_kernel<<<132, 256>>>(p, 1); });
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(132);
  config.blockDim = dim3(256);
  config.attrs = &attr;
  config.numAttrs = 1;
  report("launch overlapped (cudaLaunchKernelEx)", kCalls, [&] { cudaLaunchKernelEx(&config, overlapped_kernel, p, 1); });
  report("cudaMallocAsync + cudaFreeAsync, 32 KiB", kCalls, [&] {
    void* q = nullptr;
    cudaMallocAsync(&q, 32768, 0);
    cudaFreeAsync(q, 0);
  });
  int host[10] = {};
  report("cudaMemcpyAsync host to device, 40 B", 2000,
         [&] { cudaMemcpyAsync(p, host, sizeof host, cudaMemcpyHostToDevice, 0); });
  report("cudaMemcpy device to host, 40 B", 2000, [&] { cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost); });
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaFree(p));
  return 0;
}
