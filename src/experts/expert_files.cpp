#include "experts/expert_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

ReadOp ExpertFiles::read_op(int layer, int expert, uint8_t* dst) const {
  const ExpertLayer& l = index_.layers[size_t(layer)];
  return {fds_[size_t(layer)], uint64_t(expert) * l.stride, l.stride, dst};
}

void ExpertFiles::check(int layer, int expert, const ReadOp& op) const {
  const ExpertLayer& l = index_.layers[size_t(layer)];
  const std::string path = (fs::path(dir_) / l.file).string();
  auto where = [&] { return fmt::format("{}: layer {}, expert {}", path, l.name, expert); };
  if (op.result < 0) fail("{}: read failed: {}", where(), std::strerror(int(-op.result)));
  if (uint64_t(op.result) < l.record_bytes)
    fail("{}: short read ({} of {} bytes): the blob is truncated", where(), op.result, l.record_bytes);
  const auto* rec = static_cast<const uint8_t*>(op.dst);
  check_record_header(index_, l, expert, rec, path);
  if (verify_ && record_checksum(l, rec) != l.checksums[size_t(expert)])
    fail("{}: checksum mismatch: the record is corrupt", where());
}

}  // namespace ms
