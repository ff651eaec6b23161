#include "util/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace ms {

namespace {
thread_local bool t_in_worker = false;
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mu;

int default_threads() {
  if (const char* env = std::getenv("MOESTREAM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  std::lock_guard lk(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(default_threads());
  return *g_pool;
}

void ThreadPool::set_global_threads(int threads) {
  std::lock_guard lk(g_pool_mu);
  g_pool = std::make_unique<ThreadPool>(threads > 0 ? threads : default_threads());
}

void ThreadPool::run_chunks() {
  for (;;) {
    size_t begin;
    {
      std::lock_guard lk(mu_);
      if (next_ >= n_) return;
      begin = next_;
      next_ = std::min(n_, next_ + chunk_);
    }
    (*fn_)(begin, std::min(n_, begin + chunk_));
  }
}

void ThreadPool::worker_loop(int) {
  t_in_worker = true;
  unsigned long seen = 0;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++busy_;
    }
    run_chunks();
    {
      std::lock_guard lk(mu_);
      if (--busy_ == 0) done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  if (t_in_worker || workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard call(call_mu_);
  {
    std::lock_guard lk(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    // A few chunks per thread balance uneven work without much locking.
    chunk_ = std::max(grain, (n + size_t(size()) * 4 - 1) / (size_t(size()) * 4));
    ++generation_;
  }
  wake_.notify_all();
  t_in_worker = true;
  run_chunks();
  t_in_worker = false;
  std::unique_lock lk(mu_);
  done_.wait(lk, [&] { return busy_ == 0 && next_ >= n_; });
  fn_ = nullptr;
}

}  // namespace ms
