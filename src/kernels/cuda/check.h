#pragma once
// CUDA_CHECK(call): throws ms::Error naming the file, line and call when a CUDA runtime call
// fails. Kept free of fmt so that nvcc-compiled files can use it.
#include <cuda_runtime_api.h>

#include <string>

namespace ms::cuda {
[[noreturn]] void cuda_fail(const char* file, int line, const char* call, cudaError_t err);
// Throws ms::Error(msg): argument checks of the nvcc-compiled wrappers.
[[noreturn]] void arg_fail(const std::string& msg);
}  // namespace ms::cuda

#define CUDA_CHECK(call)                                                        \
  do {                                                                          \
    const cudaError_t ms_cuda_err_ = (call);                                    \
    if (ms_cuda_err_ != cudaSuccess) ::ms::cuda::cuda_fail(__FILE__, __LINE__, #call, ms_cuda_err_); \
  } while (0)

// After a kernel launch: a bad configuration shows here, a fault at the next synchronisation.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
