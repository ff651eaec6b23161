#pragma once
// Device memory, one owning type for it (DeviceArray<T>), taken one of two ways: stream-ordered
// on the compute stream, small sizes reused, and a captured decode step's arena (DeviceArena)
// whose buffers stay its own; or at once with cudaMalloc, for memory other streams use too.
// Plain C++17: no CUDA headers, and nvcc-compiled files include it.
#include <cstddef>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ms::cuda {

// Stream-ordered device memory on the compute stream (cudaMallocAsync, small sizes reused):
// cheap enough to take per activation. device_free takes the size device_alloc was given.
void* device_alloc(size_t bytes);
void device_free(void* p, size_t bytes);
// Device memory usable at once from any stream (cudaMalloc), as the copy stream fills the VRAM
// expert pool's slots; device_free_now waits for the device, as cudaFree does.
void* device_alloc_now(size_t bytes);
void device_free_now(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Queued on the compute stream; src (host memory) may be reused once it returns.
void copy_to_device_async(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
// Queued on the compute stream into dst, host memory (pinned, or the copy waits): read it once a
// ComputeMark recorded after the call is done.
void copy_to_host_async(void* dst, const void* src, size_t bytes);
void zero_on_device(void* dst, size_t bytes);
// Throws ms::Error: `op` of n elements at `at` does not fit in an array of `size`.
[[noreturn]] void device_range_fail(const char* op, size_t n, size_t at, size_t size);

// How a DeviceArray takes its memory: Stream is device_alloc (arena-aware), Now is
// device_alloc_now. The array frees it the same way.
enum class DeviceAlloc { Stream, Now };

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n, DeviceAlloc mode = DeviceAlloc::Stream)
      : p_(static_cast<T*>(mode == DeviceAlloc::Now ? device_alloc_now(n * sizeof(T)) : device_alloc(n * sizeof(T)))),
        n_(n),
        mode_(mode) {}
  ~DeviceArray() {
    if (mode_ == DeviceAlloc::Now)
      device_free_now(p_);
    else
      device_free(p_, bytes());
  }
  DeviceArray(DeviceArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), mode_(o.mode_) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(mode_, o.mode_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  static DeviceArray from(const T* host, size_t n, DeviceAlloc mode = DeviceAlloc::Stream) {
    DeviceArray a(n, mode);
    copy_to_device(a.p_, host, n * sizeof(T));
    return a;
  }
  static DeviceArray from(const std::vector<T>& v, DeviceAlloc mode = DeviceAlloc::Stream) {
    return from(v.data(), v.size(), mode);
  }
  // As from, queued on the compute stream: the host does not wait for the device (host memory
  // may be reused once it returns).
  static DeviceArray from_async(const T* host, size_t n) {
    DeviceArray a(n);
    copy_to_device_async(a.p_, host, n * sizeof(T));
    return a;
  }
  static DeviceArray from_async(const std::vector<T>& v) { return from_async(v.data(), v.size()); }
  // Copies n elements from host memory to elements at.. (waits for the copy) and back.
  void upload(const T* src, size_t n, size_t at = 0) {
    check_range("DeviceArray::upload", n, at);
    copy_to_device(p_ + at, src, n * sizeof(T));
  }
  void download(T* dst, size_t n, size_t at = 0) const {
    check_range("DeviceArray::download", n, at);
    copy_to_host(dst, p_ + at, n * sizeof(T));
  }
  std::vector<T> to_vector() const {
    std::vector<T> v(n_);
    copy_to_host(v.data(), p_, bytes());
    return v;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void check_range(const char* op, size_t n, size_t at) const {
    if (at > n_ || n > n_ - at) device_range_fail(op, n, at, n_);
  }

  T* p_ = nullptr;
  size_t n_ = 0;
  DeviceAlloc mode_ = DeviceAlloc::Stream;
};

// The device memory of a captured decode step (DecodeGraph). While an ArenaScope is open on a
// thread, device_alloc there takes from its arena and device_free gives the arena's buffers back
// to it. A graph replays the addresses it was captured with, so its activations stay its own for
// its life; within the capture a freed buffer may serve a later allocation, since the step is
// one chain of work on one stream, done with the first before the second.
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  void* take(size_t bytes);
  bool give(void* p, size_t bytes);  // false, doing nothing: not the arena's
  size_t lent() const { return lent_; }  // buffers taken and not given back

 private:
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_set<void*> mine_;
  size_t lent_ = 0;
};

class ArenaScope {
 public:
  explicit ArenaScope(DeviceArena& arena);
  ~ArenaScope();
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  DeviceArena* outer_;
};

}  // namespace ms::cuda
