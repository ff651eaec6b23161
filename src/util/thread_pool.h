#pragma once
// A fixed set of worker threads that split a range of work items. The caller's thread takes a
// share too, so a pool of N threads uses N cores. One parallel_for runs at a time; a call made
// from inside a worker runs inline (no nested parallelism, no deadlock). An exception a chunk
// throws reaches the caller once every chunk has ended.
//
// A decode step makes hundreds of short parallel calls, so handing work out must cost little
// besides the work: chunks are claimed with an atomic counter, and idle workers spin briefly on
// the job's generation before they sleep on it (a futex), so that back-to-back calls wake no one
// through the kernel; a call makes a wake-up syscall only where a worker sleeps.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ms {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n); at least `grain` items a chunk.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1);

  // The process-wide pool (MOESTREAM_THREADS or the number of cores).
  static ThreadPool& global();
  static void set_global_threads(int threads);

 private:
  struct Job {
    const std::function<void(size_t, size_t)>* fn;
    size_t n, chunk;
    std::atomic<size_t> next{0};  // the first item not yet claimed
    std::atomic<size_t> done{0};  // items finished (or thrown from)
    std::mutex error_mu;
    std::exception_ptr error;     // the first exception a chunk threw, rethrown to the caller
  };

  void worker_loop();
  static void run_chunks(Job& job);
  // Waits until generation_ differs from `seen`: spinning first, then asleep.
  uint32_t await_generation(uint32_t seen);

  std::vector<std::thread> workers_;
  std::mutex call_mu_;                 // serialises parallel_for callers
  std::atomic<Job*> job_{nullptr};     // the call in progress
  std::atomic<uint32_t> generation_{0};  // bumped for every call (and to stop)
  std::atomic<int> inside_{0};         // workers that may be looking at job_
  std::atomic<int> sleepers_{0};       // workers asleep on generation_
  std::atomic<bool> stop_{false};
};

}  // namespace ms
