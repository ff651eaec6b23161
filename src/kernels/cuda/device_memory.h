#pragma once
// Device memory as the CUDA backend takes it: stream-ordered on the compute stream, small sizes
// reused, and a captured decode step's arena (DeviceArena) whose buffers stay its own.
#include <cstddef>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ms {

// Stream-ordered device memory on the compute stream (cudaMallocAsync, small sizes reused):
// cheap enough to take per activation. device_free takes the size device_alloc was given.
void* device_alloc(size_t bytes);
void device_free(void* p, size_t bytes);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Queued on the compute stream; src (host memory) may be reused once it returns.
void copy_to_device_async(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
void zero_on_device(void* dst, size_t bytes);

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : p_(static_cast<T*>(device_alloc(n * sizeof(T)))), n_(n) {}
  ~DeviceArray() { device_free(p_, n_ * sizeof(T)); }
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  static DeviceArray from(const T* host, size_t n) {
    DeviceArray a(n);
    copy_to_device(a.p_, host, n * sizeof(T));
    return a;
  }
  std::vector<T> to_vector() const {
    std::vector<T> v(n_);
    copy_to_host(v.data(), p_, n_ * sizeof(T));
    return v;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
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

}  // namespace ms
