#pragma once
// The CUDA backend's device plumbing, usable from plain C++ without CUDA headers: whether a GPU
// is there, device memory as an owning buffer, and waiting for queued work. Kernels run on the
// default stream (streams come with the GPU forward).
#include <cstddef>
#include <vector>

namespace ms::cuda {

// True when a CUDA device and a driver that can run this build are present; never throws.
bool cuda_available();

// Waits for every kernel queued so far; throws ms::Error naming the failure of one of them.
void synchronize();

// Device memory, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

  // Copies bytes from host memory to offset (waits for the copy) and back.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;

  template <class T>
  static DeviceBuffer from(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    b.upload(v.data(), b.size());
    return b;
  }
  template <class T>
  std::vector<T> to_vector() const {
    std::vector<T> v(bytes_ / sizeof(T));
    download(v.data(), v.size() * sizeof(T));
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ms::cuda
