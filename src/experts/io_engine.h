#pragma once
// Batched reads of expert records: all misses of a layer are submitted together. io_uring
// where the kernel offers it, a pool of pread threads otherwise.
#include <cstddef>
#include <cstdint>
#include <memory>
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

IoKind parse_io_kind(const std::string& name);  // "auto" | "uring" | "pread"

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Performs every read and returns when all have completed; each op's result tells how it
  // went (the caller, who knows which file, layer and expert an op is, reports failures).
  virtual void read_all(std::vector<ReadOp>& ops) = 0;
  virtual const char* name() const = 0;
};

// Auto: io_uring if it can be set up here, else pread.
std::unique_ptr<IoEngine> make_io_engine(IoKind kind, int queue_depth = 64);

}  // namespace ms
