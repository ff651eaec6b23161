#pragma once
// Reads of expert records in the background: io_uring where the kernel offers it, a pool of
// pread threads otherwise. Demand reads (a forward waits for them) go before every queued
// prefetch read, and the prefetch reads in flight are capped so that a demand read never queues
// behind more than a few of them on the device.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ms {

struct ReadOp {
  int fd = -1;
  uint64_t offset = 0;
  size_t bytes = 0;
  void* dst = nullptr;
  int64_t result = 0;  // bytes read, or -errno
};

enum class IoKind { Auto, Uring, Pread };
enum class ReadPriority { Demand, Prefetch };

IoKind parse_io_kind(const std::string& name);  // "auto" | "uring" | "pread"

// A read the engine performs in the background. Whoever submits it keeps it alive and its
// destination untouched until done(); op.result is valid from then on.
struct AsyncRead {
  ReadOp op;
  ReadPriority priority = ReadPriority::Demand;
  std::atomic<bool> finished{false};
  bool done() const { return finished.load(std::memory_order_acquire); }
};

// What the engine did since it started, for the prefetcher's width and for --stats.
struct IoCounters {
  uint64_t demand_reads = 0, prefetch_reads = 0, bytes = 0;
  // Demand reads submitted while prefetch reads were in flight: prefetching took bandwidth then.
  uint64_t demand_behind_prefetch = 0;
  double busy_s = 0;  // wall time with at least one read in flight
  uint64_t fixed_reads = 0;  // reads into registered memory (register_memory)
};

// Memory that reads land in, for IoEngine::register_memory.
struct MemoryRegion {
  void* data = nullptr;
  size_t bytes = 0;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Queues reads that are not in flight; each becomes done() once read (or failed).
  void submit(AsyncRead* const* reads, size_t n);
  // Blocks until pred() holds; it is evaluated again after every completion.
  void wait_until(const std::function<bool()>& pred);
  // Performs every op as a demand read and returns when all have completed; each op's result
  // tells how it went (the caller, who knows which file, layer and expert an op is, reports).
  void read_all(std::vector<ReadOp>& ops);
  // A queued prefetch read that a forward now waits for becomes a demand read (ahead of every
  // queued prefetch read); one already in flight or done is left as it is.
  void expedite(AsyncRead* r);
  IoCounters counters() const;
  virtual const char* name() const = 0;
  // Registers the memory reads will land in, once and before the first read, where the engine
  // can make such reads cheaper (io_uring fixed buffers: the pages are pinned once, not on every
  // read). Reads into other memory work as before. Returns the bytes registered: 0 where the
  // engine has no use for it, reads were made already, or the kernel refused (RLIMIT_MEMLOCK
  // without CAP_IPC_LOCK); registered_bytes() tells later.
  virtual uint64_t register_memory(const std::vector<MemoryRegion>& regions) {
    (void)regions;
    return 0;
  }
  virtual uint64_t registered_bytes() const { return 0; }

 protected:
  explicit IoEngine(int prefetch_depth) : prefetch_depth_(prefetch_depth) {}
  // The next queued read that may start (demand first), counted in flight; null if none.
  AsyncRead* take_locked();
  // Records the result of a read taken with take_locked(), and wakes its waiters.
  void complete(AsyncRead* r, int64_t result);
  void count_fixed_read_locked() { ++counters_.fixed_reads; }
  // Tells the engine's thread(s) that reads were queued (or that it is stopping).
  virtual void wake() = 0;
  // Blocks until nothing is queued or in flight: before an engine stops its threads.
  void drain();

  mutable std::mutex mu_;
  std::condition_variable work_;  // for engines whose threads wait on the queue
  bool stop_ = false;

 private:
  std::deque<AsyncRead*> demand_, prefetch_;
  int in_flight_ = 0, prefetch_in_flight_ = 0;
  const int prefetch_depth_;
  double busy_since_ = 0;
  IoCounters counters_;
  std::mutex done_mu_;
  std::condition_variable done_;
};

// Auto: io_uring if it can be set up here, else pread. queue_depth: reads in flight at once.
std::unique_ptr<IoEngine> make_io_engine(IoKind kind, int queue_depth = 64, int prefetch_depth = 4);

}  // namespace ms
