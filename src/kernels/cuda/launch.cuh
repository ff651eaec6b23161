#pragma once
// Launch helpers the CUDA kernels share: device attributes, a kernel's shared-memory opt-in.
#include <cuda_runtime.h>

#include "kernels/cuda/check.h"

namespace ms::cuda {

inline int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
  return v;
}

// Lets `kernel` use the device's whole shared memory; returns that size. Once per kernel.
template <class Kernel>
int allow_max_smem(Kernel kernel) {
  const int m = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, m));
  return m;
}

inline int floor_log2(int v) {
  int l = 0;
  while ((2 << l) <= v) ++l;
  return l;
}

}  // namespace ms::cuda
