#include "experts/expert_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "util/error.h"

namespace ms {

namespace fs = std::filesystem;

namespace {

int open_blob(const std::string& path, bool direct) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0 && direct && errno == EINVAL) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // no O_DIRECT here (tmpfs)
  if (fd < 0) fail("{}: cannot open expert blob: {}", path, std::strerror(errno));
  return fd;
}

}  // namespace

ExpertFiles::ExpertFiles(const std::string& dir, const EngineIndex& index, IoKind io, bool direct_io, bool verify)
    : dir_(dir), index_(index), verify_(verify), io_(make_io_engine(io)) {
  try {
    for (const ExpertLayer& l : index_.layers) {
      const std::string path = (fs::path(dir) / l.file).string();
      fds_.push_back(open_blob(path, direct_io));
      const uint64_t need = uint64_t(l.n_experts) * l.stride;
      // Exactly: a longer blob is from another conversion as surely as a shorter one.
      if (fs::file_size(path) != need)
        fail("{}: expert blob of layer {} is {} bytes, the index needs exactly {} ({} experts x {} bytes)", path, l.name,
             fs::file_size(path), need, l.n_experts, l.stride);
    }
  } catch (...) {
    for (int fd : fds_) ::close(fd);
    throw;
  }
}

ExpertFiles::~ExpertFiles() {
  for (int fd : fds_) ::close(fd);
}

ReadResult ExpertFiles::read(int layer, const std::vector<int>& experts, const std::vector<uint8_t*>& dsts) {
  const ExpertLayer& l = index_.layers[size_t(layer)];
  std::vector<ReadOp> ops;
  for (size_t i = 0; i < experts.size(); ++i)
    ops.push_back({fds_[size_t(layer)], uint64_t(experts[i]) * l.stride, l.stride, dsts[i]});
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(io_mu_);
    io_->read_all(ops);
  }
  ReadResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < ops.size(); ++i) {
    auto where = [&] { return fmt::format("{}: layer {}, expert {}", (fs::path(dir_) / l.file).string(), l.name, experts[i]); };
    if (ops[i].result < 0) fail("{}: read failed: {}", where(), std::strerror(int(-ops[i].result)));
    if (uint64_t(ops[i].result) < l.record_bytes)
      fail("{}: short read ({} of {} bytes): the blob is truncated", where(), ops[i].result, l.record_bytes);
    check_record_header(index_, l, experts[i], dsts[i], (fs::path(dir_) / l.file).string());
    if (verify_ && record_checksum(dsts[i], l.record_bytes) != l.checksums[size_t(experts[i])])
      fail("{}: checksum mismatch: the record is corrupt", where());
    r.bytes += uint64_t(ops[i].result);
  }
  return r;
}

}  // namespace ms
