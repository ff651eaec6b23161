#pragma once
// Launch helpers the CUDA kernels share: device attributes, a kernel's shared-memory opt-in.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"

namespace ms::cuda {

inline int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
  return v;
}

inline int multiprocessors() {
  static const int n = device_attribute(cudaDevAttrMultiProcessorCount);
  return n;
}

// The shared memory a block may opt in to on the device (asked once).
inline int optin_smem() {
  static const int m = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return m;
}

// Lets `kernel` use the device's whole shared memory, less its static shared memory; returns the
// dynamic size it may now ask for. Once per kernel.
template <class Kernel>
int allow_max_smem(Kernel kernel) {
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const int m = optin_smem() - int(attr.sharedSizeBytes);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, m));
  return m;
}

// Programmatic dependent launch (sm_90 and newer): a kernel started by launch_overlapped may run
// while the kernel before it in the stream finishes, so that its launch and whatever it does
// before grid_dependency_wait() (reading weights, which no kernel writes) overlap that kernel's
// tail. It must wait before it reads what the kernel before it wrote or writes what it reads.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream, if launch_overlapped started it, begin before this one ends.
__device__ __forceinline__ void grid_dependents_may_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// How a kernel launched by launch_after begins: it lets the kernel after it launch at once, so that
// a matvec there is resident and asks for its first weights (prefetch_rows) while this one runs,
// then waits for the kernel before. Every kernel waits before it ends, so that a kernel's wait
// covers all those before it, however early they let it launch.
__device__ __forceinline__ void start_after_kernel_before() {
  grid_dependents_may_start();
  grid_dependency_wait();
}

// Whether `kernel` was compiled for sm_90 or newer (its PTX, which a newer device may compile for
// itself, holds the waits only then) and the device can overlap it.
template <class Kernel>
bool can_overlap(Kernel kernel) {
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return attr.ptxVersion >= 90 && device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
}

// Launches `kernel` overlapped with the kernel before it where `overlap` (can_overlap(kernel)),
// else as <<<>>> does.
template <class... Params, class... Args>
void launch_overlapped(void (*kernel)(Params...), bool overlap, dim3 grid, int threads, size_t smem, Args... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.stream = compute_stream();
  config.attrs = &attr;
  config.numAttrs = overlap ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, Params(args)...));
}

// Whether the kernel at `kernel` can overlap the one before it (can_overlap), asked once for each.
inline bool overlaps(const void* kernel) {
  static std::mutex mu;
  static std::unordered_map<const void*, bool>* known = new std::unordered_map<const void*, bool>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known->find(kernel);
  if (it == known->end()) it = known->emplace(kernel, can_overlap(kernel)).first;
  return it->second;
}

// launch_overlapped for the small kernels of a decode step (norms, the rule's inputs, routing):
// their launch, a few microseconds against their work's one or two, then overlaps the tail of the
// kernel before. Such a kernel begins with start_after_kernel_before().
template <class... Params, class... Args>
void launch_after(void (*kernel)(Params...), dim3 grid, int threads, size_t smem, Args... args) {
  launch_overlapped(kernel, overlaps(reinterpret_cast<const void*>(kernel)), grid, threads, smem, args...);
}

// A kernel's launch bookkeeping: the device's shared memory opt-in, set once, and the blocks
// resident per multiprocessor for the last shared-memory size (asking costs as much as a launch).
struct KernelLimits {
  std::mutex mu;
  int max_smem = 0;  // 0 until the opt-in
  size_t smem = 0;
  int per_sm = 0;
  bool overlap = false;  // launch_overlapped may overlap it with the kernel before (can_overlap)
};

// Blocks of `threads` threads with `smem` bytes of `kernel` that fit on the device at once; `who`
// and `cols` (the columns that need the shared memory) name the call when they do not fit.
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, size_t smem, KernelLimits& lim, const char* who, int cols) {
  std::lock_guard<std::mutex> lock(lim.mu);
  if (lim.max_smem == 0) lim.max_smem = allow_max_smem(kernel), lim.overlap = can_overlap(kernel);
  if (smem > size_t(lim.max_smem))
    arg_fail(std::string(who) + ": " + std::to_string(cols) + " columns need " + std::to_string(smem) +
             " bytes of shared memory, more than the device's " + std::to_string(lim.max_smem));
  if (lim.smem != smem) {
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&lim.per_sm, kernel, threads, smem));
    lim.smem = smem;
  }
  return std::max(1, lim.per_sm) * multiprocessors();
}

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline int floor_log2(int v) {
  int l = 0;
  while ((2 << l) <= v) ++l;
  return l;
}

}  // namespace ms::cuda
