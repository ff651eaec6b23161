#include "experts/io_engine.h"

#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
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

// Reads until the op is complete, EOF or an error; a short read at EOF leaves result < bytes.
void read_fully(ReadOp& op) {
  size_t done = 0;
  auto* dst = static_cast<uint8_t*>(op.dst);
  while (done < op.bytes) {
    const ssize_t n = pread(op.fd, dst + done, op.bytes - done, off_t(op.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      op.result = -errno;
      return;
    }
    if (n == 0) break;
    done += size_t(n);
  }
  op.result = int64_t(done);
}

class PreadEngine final : public IoEngine {
 public:
  explicit PreadEngine(int threads) : threads_(threads) {}
  const char* name() const override { return "pread"; }
  void read_all(std::vector<ReadOp>& ops) override {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < ops.size();) read_fully(ops[i]);
    };
    const int n = std::min<int>(threads_, int(ops.size()));
    std::vector<std::thread> pool;
    for (int t = 1; t < n; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
  }

 private:
  int threads_;
};

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(int depth) : depth_(depth) {
    if (int rc = io_uring_queue_init(unsigned(depth), &ring_, 0); rc < 0)
      fail("io_uring_queue_init failed: {}", std::strerror(-rc));
  }
  ~UringEngine() override { io_uring_queue_exit(&ring_); }
  const char* name() const override { return "io_uring"; }

  void read_all(std::vector<ReadOp>& ops) override {
    size_t submitted = 0, completed = 0;
    int in_flight = 0;
    while (completed < ops.size()) {
      while (submitted < ops.size() && in_flight < depth_) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) break;
        ReadOp& op = ops[submitted];
        io_uring_prep_read(sqe, op.fd, op.dst, unsigned(op.bytes), op.offset);
        io_uring_sqe_set_data64(sqe, submitted);
        ++submitted;
        ++in_flight;
      }
      if (int rc = io_uring_submit(&ring_); rc < 0) fail("io_uring_submit failed: {}", std::strerror(-rc));
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) fail("io_uring_wait_cqe failed: {}", std::strerror(-rc));
      ReadOp& op = ops[io_uring_cqe_get_data64(cqe)];
      op.result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
      ++completed;
      // A short read (not at EOF) is finished synchronously rather than failed.
      if (op.result > 0 && size_t(op.result) < op.bytes) {
        ReadOp rest{op.fd, op.offset + uint64_t(op.result), op.bytes - size_t(op.result),
                    static_cast<uint8_t*>(op.dst) + op.result, 0};
        read_fully(rest);
        op.result = rest.result < 0 ? rest.result : op.result + rest.result;
      }
    }
  }

 private:
  io_uring ring_{};
  int depth_;
};

}  // namespace

std::unique_ptr<IoEngine> make_io_engine(IoKind kind, int queue_depth) {
  if (kind == IoKind::Pread) return std::make_unique<PreadEngine>(8);
  try {
    return std::make_unique<UringEngine>(queue_depth);
  } catch (const Error&) {
    if (kind == IoKind::Uring) throw;
    return std::make_unique<PreadEngine>(8);
  }
}

}  // namespace ms
