#pragma once
// A fixed set of worker threads that split a range of work items. The caller's thread takes a
// share too, so a pool of N threads uses N cores. One parallel_for runs at a time; a call made
// from inside a worker runs inline (no nested parallelism, no deadlock).
#include <condition_variable>
#include <cstddef>
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
  void worker_loop(int index);
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serialises parallel_for callers
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  size_t n_ = 0, chunk_ = 0, next_ = 0;
  int busy_ = 0;
  unsigned long generation_ = 0;
  bool stop_ = false;
};

}  // namespace ms
