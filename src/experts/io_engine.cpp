#include "experts/io_engine.h"

#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "util/error.h"

namespace ms {

IoKind parse_io_kind(const std::string& name) {
  if (name == "auto") return IoKind::Auto;
  if (name == "uring" || name == "io_uring") return IoKind::Uring;
  if (name == "pread") return IoKind::Pread;
  fail("unknown I/O engine '{}' (expected auto, uring or pread)", name);
}

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Reads until the op is complete, EOF or an error; a short read at EOF leaves result < bytes.
int64_t read_fully(const ReadOp& op, size_t done = 0) {
  auto* dst = static_cast<uint8_t*>(op.dst);
  while (done < op.bytes) {
    const ssize_t n = pread(op.fd, dst + done, op.bytes - done, off_t(op.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += size_t(n);
  }
  return int64_t(done);
}

}  // namespace

void IoEngine::submit(AsyncRead* const* reads, size_t n) {
  if (n == 0) return;
  {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < n; ++i) {
      AsyncRead* r = reads[i];
      r->finished.store(false, std::memory_order_relaxed);
      if (r->priority == ReadPriority::Demand) {
        demand_.push_back(r);
        ++counters_.demand_reads;
        if (prefetch_in_flight_ > 0) ++counters_.demand_behind_prefetch;
      } else {
        prefetch_.push_back(r);
        ++counters_.prefetch_reads;
      }
    }
  }
  wake();
}

AsyncRead* IoEngine::take_locked() {
  AsyncRead* r = nullptr;
  if (!demand_.empty()) {
    r = demand_.front();
    demand_.pop_front();
  } else if (!prefetch_.empty() && prefetch_in_flight_ < prefetch_depth_) {
    r = prefetch_.front();
    prefetch_.pop_front();
    ++prefetch_in_flight_;
  } else {
    return nullptr;
  }
  if (in_flight_++ == 0) busy_since_ = now_s();
  return r;
}

void IoEngine::complete(AsyncRead* r, int64_t result) {
  // Once finished, r belongs to its owner again (who may free it at once): nothing reads it after.
  const bool prefetch = r->priority == ReadPriority::Prefetch;
  r->op.result = result;
  {
    std::lock_guard lk(mu_);
    if (prefetch) --prefetch_in_flight_;
    if (--in_flight_ == 0) counters_.busy_s += now_s() - busy_since_;
    if (result > 0) counters_.bytes += uint64_t(result);
  }
  {
    // Under done_mu_, so that a waiter between its check and its wait cannot miss the wake-up.
    std::lock_guard lk(done_mu_);
    r->finished.store(true, std::memory_order_release);
  }
  done_.notify_all();
  // A prefetch slot may have freed: another queued prefetch read can start.
  if (prefetch) wake();
}

void IoEngine::wait_until(const std::function<bool()>& pred) {
  std::unique_lock lk(done_mu_);
  done_.wait(lk, pred);
}

void IoEngine::read_all(std::vector<ReadOp>& ops) {
  std::unique_ptr<AsyncRead[]> reads(new AsyncRead[ops.size()]);
  std::vector<AsyncRead*> ptrs;
  for (size_t i = 0; i < ops.size(); ++i) {
    reads[i].op = ops[i];
    ptrs.push_back(&reads[i]);
  }
  submit(ptrs.data(), ptrs.size());
  wait_until([&] {
    for (AsyncRead* r : ptrs)
      if (!r->done()) return false;
    return true;
  });
  for (size_t i = 0; i < ops.size(); ++i) ops[i].result = reads[i].op.result;
}

void IoEngine::expedite(AsyncRead* r) {
  {
    std::lock_guard lk(mu_);
    auto it = std::find(prefetch_.begin(), prefetch_.end(), r);
    if (it == prefetch_.end()) return;
    prefetch_.erase(it);
    r->priority = ReadPriority::Demand;
    demand_.push_back(r);
  }
  wake();
}

IoCounters IoEngine::counters() const {
  std::lock_guard lk(mu_);
  IoCounters c = counters_;
  if (in_flight_ > 0) c.busy_s += now_s() - busy_since_;
  return c;
}

void IoEngine::drain() {
  wait_until([&] {
    std::lock_guard lk(mu_);
    return demand_.empty() && prefetch_.empty() && in_flight_ == 0;
  });
}

namespace {

// Worker threads that each take the next read and pread it.
class PreadEngine final : public IoEngine {
 public:
  PreadEngine(int threads, int prefetch_depth) : IoEngine(prefetch_depth) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { work(); });
  }
  ~PreadEngine() override {
    drain();
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    work_.notify_all();
    for (auto& t : threads_) t.join();
  }
  const char* name() const override { return "pread"; }

 private:
  void wake() override { work_.notify_all(); }
  void work() {
    for (;;) {
      AsyncRead* r = nullptr;
      {
        std::unique_lock lk(mu_);
        work_.wait(lk, [&] { return stop_ || (r = take_locked()) != nullptr; });
        if (!r) return;
      }
      complete(r, read_fully(r->op));
    }
  }
  std::vector<std::thread> threads_;
};

// One thread that keeps up to `depth` reads in an io_uring and reaps them as they complete; an
// eventfd polled in the same ring wakes it when reads are queued.
class UringEngine final : public IoEngine {
 public:
  UringEngine(int depth, int prefetch_depth) : IoEngine(prefetch_depth), depth_(depth) {
    if (int rc = io_uring_queue_init(unsigned(depth + 2), &ring_, 0); rc < 0)
      fail("io_uring_queue_init failed: {}", std::strerror(-rc));
    event_ = eventfd(0, EFD_CLOEXEC);
    if (event_ < 0) {
      io_uring_queue_exit(&ring_);
      fail("eventfd failed: {}", std::strerror(errno));
    }
    // The thread starts with the first read (wake()): until then nothing is in flight in the
    // ring, so register_memory needs no quiesce (kernels before 5.13 wait in it for every
    // request in flight, the thread's armed poll included, and would never return).
  }
  ~UringEngine() override {
    drain();
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    if (started_.load()) {
      signal();
      thread_.join();
    }
    io_uring_queue_exit(&ring_);
    ::close(event_);
  }
  const char* name() const override { return "io_uring"; }

  uint64_t register_memory(const std::vector<MemoryRegion>& regions) override {
    std::vector<Fixed> fixed;
    std::vector<iovec> iov;
    for (const MemoryRegion& r : regions)  // a fixed buffer holds at most 1 GiB
      for (size_t at = 0; at < r.bytes; at += kMaxFixed) {
        auto* begin = static_cast<uint8_t*>(r.data) + at;
        const size_t n = std::min(kMaxFixed, r.bytes - at);
        fixed.push_back({begin, begin + n, int(iov.size())});
        iov.push_back({begin, n});
      }
    if (iov.empty() || iov.size() > kMaxBuffers) return 0;
    std::lock_guard lk(mu_);
    if (!fixed_.empty() || started_.load()) return 0;  // once only, before the first read
    if (io_uring_register_buffers(&ring_, iov.data(), unsigned(iov.size())) < 0) return 0;
    std::sort(fixed.begin(), fixed.end(), [](const Fixed& a, const Fixed& b) { return a.begin < b.begin; });
    fixed_ = std::move(fixed);
    for (const iovec& v : iov) registered_ += v.iov_len;
    return registered_;
  }
  uint64_t registered_bytes() const override {
    std::lock_guard lk(mu_);
    return registered_;
  }

 private:
  static constexpr uint64_t kWakeTag = ~uint64_t(0);
  static constexpr size_t kMaxFixed = size_t(1) << 30;
  static constexpr size_t kMaxBuffers = 16384;  // the kernel's limit on registered buffers

  struct Fixed {  // a registered buffer: [begin, end) and its index
    uint8_t* begin;
    uint8_t* end;
    int index;
  };

  // The registered buffer [dst, dst + bytes) lies in, or -1 (under mu_).
  int fixed_index_locked(const ReadOp& op) const {
    auto* dst = static_cast<uint8_t*>(op.dst);
    auto it = std::upper_bound(fixed_.begin(), fixed_.end(), dst, [](uint8_t* p, const Fixed& f) { return p < f.begin; });
    if (it == fixed_.begin()) return -1;
    --it;
    return dst + op.bytes <= it->end ? it->index : -1;
  }

  void wake() override {
    std::call_once(start_, [this] {
      started_.store(true);
      thread_ = std::thread([this] { run(); });
    });
    signal();
  }
  void signal() {
    const uint64_t one = 1;
    while (::write(event_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
  void arm_wake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_poll_add(sqe, event_, POLLIN);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }
  void run() {
    arm_wake();
    int in_ring = 0;
    for (;;) {
      {
        std::lock_guard lk(mu_);
        if (stop_) break;
        while (in_ring < depth_) {
          AsyncRead* r = take_locked();
          if (!r) break;
          io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
          if (const int index = fixed_index_locked(r->op); index >= 0) {
            io_uring_prep_read_fixed(sqe, r->op.fd, r->op.dst, unsigned(r->op.bytes), r->op.offset, index);
            count_fixed_read_locked();
          } else {
            io_uring_prep_read(sqe, r->op.fd, r->op.dst, unsigned(r->op.bytes), r->op.offset);
          }
          io_uring_sqe_set_data(sqe, r);
          ++in_ring;
        }
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR) fail("io_uring_submit_and_wait failed: {}", std::strerror(-rc));
      io_uring_cqe* cqe = nullptr;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
        const uint64_t tag = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        if (tag == kWakeTag) {
          uint64_t n;
          while (::read(event_, &n, sizeof n) < 0 && errno == EINTR) {
          }
          arm_wake();
          continue;
        }
        auto* r = reinterpret_cast<AsyncRead*>(tag);
        --in_ring;
        // A short read (not at EOF) is finished synchronously rather than failed.
        complete(r, res > 0 && size_t(res) < r->op.bytes ? read_fully(r->op, size_t(res)) : int64_t(res));
      }
    }
  }

  io_uring ring_{};
  int depth_, event_ = -1;
  std::vector<Fixed> fixed_;  // sorted by begin (under mu_)
  uint64_t registered_ = 0;
  std::once_flag start_;
  std::atomic<bool> started_{false};
  std::thread thread_;
};

}  // namespace

std::unique_ptr<IoEngine> make_io_engine(IoKind kind, int queue_depth, int prefetch_depth) {
  if (kind == IoKind::Pread) return std::make_unique<PreadEngine>(8, prefetch_depth);
  try {
    return std::make_unique<UringEngine>(queue_depth, prefetch_depth);
  } catch (const Error&) {
    if (kind == IoKind::Uring) throw;
    return std::make_unique<PreadEngine>(8, prefetch_depth);
  }
}

}  // namespace ms
