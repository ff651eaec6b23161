#include "kernels/cuda/device_memory.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "util/error.h"

namespace ms::cuda {

namespace {
// Freed buffers of up to kReusedMaxBytes, by size, for the next device_alloc of that size: a
// decode step takes and frees the same few dozen activation sizes in every layer, and a
// cudaMallocAsync and cudaFreeAsync pair costs host time a launch-bound decode step does not
// have (docs/PERFORMANCE.md#cuda-device-memory). Reuse is stream-ordered as cudaFreeAsync's is:
// every user of these buffers works on the compute stream. Larger buffers (prefill's) go back
// to the pool, which can serve other sizes from them, and so do buffers past kReusedTotalBytes
// held (prompts of many lengths leave many sizes; a decode step's all fit in a few MB).
constexpr size_t kReusedMaxBytes = size_t(1) << 20, kReusedTotalBytes = size_t(64) << 20;

struct FreeBuffers {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> by_size;
  size_t bytes = 0;  // held in by_size
};

FreeBuffers& free_buffers() {
  static FreeBuffers* f = new FreeBuffers;  // never destroyed: buffers may be freed at exit
  return *f;
}

thread_local DeviceArena* t_arena = nullptr;  // the open ArenaScope's

// A freed buffer of `bytes` from free lists by size, or null when there is none.
void* pop_free(std::unordered_map<size_t, std::vector<void*>>& by_size, size_t bytes) {
  std::vector<void*>& v = by_size[bytes];
  if (v.empty()) return nullptr;
  void* p = v.back();
  v.pop_back();
  return p;
}
}  // namespace

DeviceArena::~DeviceArena() {
  for (void* p : mine_) cudaFree(p);  // no throwing from a destructor
}

void* DeviceArena::take(size_t bytes) {
  void* p = pop_free(free_, bytes);
  if (!p) {
    CUDA_CHECK(cudaMalloc(&p, bytes));
    mine_.insert(p);
  }
  ++lent_;
  return p;
}

bool DeviceArena::give(void* p, size_t bytes) {
  if (!mine_.count(p)) return false;
  free_[bytes].push_back(p);
  --lent_;
  return true;
}

ArenaScope::ArenaScope(DeviceArena& arena) : outer_(std::exchange(t_arena, &arena)) {}
ArenaScope::~ArenaScope() { t_arena = outer_; }

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (t_arena) return t_arena->take(bytes);
  if (bytes <= kReusedMaxBytes) {
    FreeBuffers& f = free_buffers();
    std::lock_guard<std::mutex> lock(f.mu);
    if (void* p = pop_free(f.by_size, bytes)) {
      f.bytes -= bytes;
      return p;
    }
  }
  static const bool pool_kept = [] {
    // Keep freed blocks in the default pool instead of returning them at every synchronisation:
    // a forward frees and takes the same sizes again.
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return true;
  }();
  (void)pool_kept;
  void* p = nullptr;
  CUDA_CHECK(cudaMallocAsync(&p, bytes, compute_stream()));
  return p;
}

void device_free(void* p, size_t bytes) {
  if (!p || (t_arena && t_arena->give(p, bytes))) return;
  if (bytes <= kReusedMaxBytes) {
    FreeBuffers& f = free_buffers();
    std::lock_guard<std::mutex> lock(f.mu);
    if (f.bytes + bytes <= kReusedTotalBytes) {
      f.by_size[bytes].push_back(p);
      f.bytes += bytes;
      return;
    }
  }
  cudaFreeAsync(p, compute_stream());  // no throwing from destructors; a fault shows at the next check
}

void* device_alloc_now(size_t bytes) {
  void* p = nullptr;
  if (bytes) CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void device_free_now(void* p) {
  if (p) cudaFree(p);  // no throwing from destructors; a failure here has nothing to name
}

void device_range_fail(const char* op, size_t n, size_t at, size_t size) {
  fail("{}: {} elements at {} past the end of {}", op, n, at, size);
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void copy_to_device_async(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_stream()));
}

void copy_to_host_async(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_stream()));
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_stream()));
}

void zero_on_device(void* dst, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, compute_stream()));
}

}  // namespace ms::cuda
