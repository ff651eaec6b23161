#pragma once
// CUDA_CHECK(call): throws ms::Error naming the file, line and call when a CUDA runtime call
// fails. Kept free of fmt so that nvcc-compiled files can use it.
#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>

namespace ms::cuda {
[[noreturn]] void cuda_fail(const char* file, int line, const char* call, cudaError_t err);
// Throws ms::Error(msg): argument checks of the nvcc-compiled wrappers.
[[noreturn]] void arg_fail(const std::string& msg);

// Calls f(std::integral_constant<int, B>{}) for the B among WIDTHS equal to `bits`: how a code
// width known at run time picks a kernel template. Another width is an argument error of `who`.
template <int... WIDTHS, class F>
void with_bits(int bits, const char* who, F&& f) {
  if (!((bits == WIDTHS && (f(std::integral_constant<int, WIDTHS>{}), true)) || ...))
    arg_fail(std::string(who) + ": no kernel for " + std::to_string(bits) + "-bit weights");
}
}  // namespace ms::cuda

#define CUDA_CHECK(call)                                                        \
  do {                                                                          \
    const cudaError_t ms_cuda_err_ = (call);                                    \
    if (ms_cuda_err_ != cudaSuccess) ::ms::cuda::cuda_fail(__FILE__, __LINE__, #call, ms_cuda_err_); \
  } while (0)

// After a kernel launch: a bad configuration shows here, a fault at the next synchronisation.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
