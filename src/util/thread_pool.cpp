#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ms {

namespace {
thread_local bool t_in_worker = false;
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mu;

// How long an idle worker spins before it sleeps: longer than the serial work between two
// parallel calls of a decode step (norms, routing, a small op), far shorter than a token.
constexpr auto kSpin = std::chrono::microseconds(50);

int default_threads() {
  if (const char* env = std::getenv("MOESTREAM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
// The futex under generation_: Linux's own, so that the wait and the wake are one syscall each
// with nothing between (std::atomic::wait would do as well).
void futex_wait(std::atomic<uint32_t>& word, uint32_t seen) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

// Spins until pred() holds, yielding the core now and then: a worker still in its chunk may
// share it (more threads than cores, or the I/O thread beside them).
template <class Pred>
void spin_until(Pred&& pred) {
  for (int i = 1; !pred(); ++i) {
    cpu_relax();
    if (i % 1024 == 0) std::this_thread::yield();
  }
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  futex_wake_all(generation_);
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

void ThreadPool::run_chunks(Job& job) {
  for (;;) {
    const size_t begin = job.next.fetch_add(job.chunk);
    if (begin >= job.n) return;
    const size_t end = std::min(job.n, begin + job.chunk);
    try {
      (*job.fn)(begin, end);
    } catch (...) {
      std::lock_guard lk(job.error_mu);
      if (!job.error) job.error = std::current_exception();
    }
    job.done.fetch_add(end - begin, std::memory_order_release);
  }
}

uint32_t ThreadPool::await_generation(uint32_t seen) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (const uint32_t g = generation_.load(std::memory_order_acquire); g != seen) return g;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) break;
  }
  // A caller that bumps generation_ after this increment sees the sleeper and wakes it; one
  // that bumped it before makes wait() return at once (the futex compares the value).
  sleepers_.fetch_add(1);
  while (generation_.load() == seen) futex_wait(generation_, seen);  // also after a spurious wake
  sleepers_.fetch_sub(1);
  return generation_.load(std::memory_order_acquire);
}

void ThreadPool::worker_loop() {
  t_in_worker = true;
  // The first generation, not a load: a worker that starts late still sees the calls made
  // before it ran, and a stop.
  uint32_t seen = 0;
  for (;;) {
    seen = await_generation(seen);
    if (stop_.load()) return;
    // inside_ first: the caller does not let its job go while a worker may still read it.
    inside_.fetch_add(1);
    if (Job* job = job_.load()) run_chunks(*job);
    inside_.fetch_sub(1);
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
  // A few chunks per thread balance uneven work without much contention on the counter.
  Job job{&fn, n, std::max(grain, (n + size_t(size()) * 4 - 1) / (size_t(size()) * 4))};
  job_.store(&job);
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) futex_wake_all(generation_);
  t_in_worker = true;
  run_chunks(job);
  t_in_worker = false;
  spin_until([&] { return job.done.load(std::memory_order_acquire) >= n; });
  job_.store(nullptr);
  spin_until([&] { return inside_.load() == 0; });
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace ms
