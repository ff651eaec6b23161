#include "kernels/cuda/device.h"

#include <utility>

#include "kernels/cuda/check.h"
#include "util/error.h"

namespace ms::cuda {

void cuda_fail(const char* file, int line, const char* call, cudaError_t err) {
  fail("{}:{}: {} failed: {} ({})", file, line, call, cudaGetErrorString(err), cudaGetErrorName(err));
}

void arg_fail(const std::string& msg) { throw Error(msg); }

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

void synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // no throwing from a destructor; a failure here has nothing to name
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) fail("DeviceBuffer::upload: {} bytes at {} past the end of {}", bytes, offset, bytes_);
  CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) fail("DeviceBuffer::download: {} bytes at {} past the end of {}", bytes, offset, bytes_);
  CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace ms::cuda
