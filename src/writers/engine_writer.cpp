#include "writers/engine_writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

#include "quant/affine.h"
#include "util/error.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace ms {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTempSuffix = ".tmp-";
constexpr size_t kTempRandom = 6;  // mkdtemp's XXXXXX

// Whether `name` is what TempDir names a temporary directory for an output called `out_name`.
bool is_temp_name(const std::string& name, const std::string& out_name) {
  const std::string prefix = out_name + std::string(kTempSuffix);
  return name.size() == prefix.size() + kTempRandom && name.compare(0, prefix.size(), prefix) == 0;
}

// kWriterLock of `dir` opened (created where missing) and locked without waiting; -1 when another
// process holds it or it cannot be opened.
int try_lock_writer(const fs::path& dir) {
  const int fd = ::open((dir / TempDir::kWriterLock).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int remove_dead_temp_dirs(const fs::path& out) {
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  const std::string out_name = out.filename().string();
  std::error_code ec;
  int removed = 0;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    if (!is_temp_name(e.path().filename().string(), out_name) || !e.is_directory(ec) || e.is_symlink(ec)) continue;
    const int fd = try_lock_writer(e.path());
    if (fd < 0) continue;  // its writer is alive (or it is not ours to touch)
    fs::remove_all(e.path(), ec);
    ::close(fd);
    removed += ec ? 0 : 1;
  }
  return removed;
}

TempDir::TempDir(const fs::path& out) {
  remove_dead_temp_dirs(out);
  std::string pattern = out.string() + std::string(kTempSuffix) + std::string(kTempRandom, 'X');
  if (!mkdtemp(pattern.data())) fail("{}: cannot create a temporary directory beside it: {}", out.string(), std::strerror(errno));
  path_ = pattern;
  lock_fd_ = try_lock_writer(path_);
  // Another writer to the same output may have taken the new directory for a dead one between
  // mkdtemp and the lock: it is gone, or going.
  if (lock_fd_ < 0 || !fs::exists(path_ / kWriterLock)) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    fail("{}: another writer to {} removed this one's temporary directory; run again", path_.string(), out.string());
  }
  fs::permissions(path_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                             fs::perms::others_exec);
}

TempDir::~TempDir() {
  if (!path_.empty()) {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void TempDir::commit(const fs::path& out, bool force) {
  if (fs::exists(out)) {
    if (!force) fail("{}: already exists (use --force to replace it)", out.string());
    fs::remove_all(out);
  }
  // Renamed while locked, so that no other writer takes it for a dead one; the lock file goes after.
  fs::rename(path_, out);
  path_.clear();
  std::error_code ec;
  fs::remove(out / kWriterLock, ec);
  ::close(lock_fd_);
  lock_fd_ = -1;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_router(const std::string& name) { return ends_with(name, ".mlp.gate.weight") || ends_with(name, ".shared_expert_gate.weight"); }

}  // namespace

// Routers stay as stored (they pick the experts, and are small); embedding and lm_head take
// at least 8 bits; what is not a 2-D float matrix whose rows split into whole groups is copied
// as stored.
int dense_bits_for(const std::string& name, const std::vector<int64_t>& shape, bool is_float, int dense_bits,
                   int dense_group) {
  if (dense_bits == kRawBits || shape.size() != 2 || !is_float || is_router(name)) return kRawBits;
  if (shape[1] % dense_group != 0 || shape[0] == 0) return kRawBits;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return std::max(dense_bits, 8);
  return dense_bits;
}

size_t add_dense_specs(const std::string& name, DType dtype, const std::vector<int64_t>& shape, int bits, int group,
                       std::vector<TensorSpec>* specs) {
  const size_t first = specs->size();
  if (bits == kRawBits) {
    specs->push_back({name, dtype, shape});
  } else {
    const int64_t rows = shape[0], cols = shape[1];
    specs->push_back({name + ".q", DType::U8, {rows, cols * bits / 8}});
    specs->push_back({name + ".scales", DType::BF16, {rows, cols / group}});
    specs->push_back({name + ".biases", DType::BF16, {rows, cols / group}});
  }
  return first;
}

size_t dense_rows_per_piece(size_t cols) { return std::max<size_t>(1, kDenseChunkValues / cols); }

void write_quantized_rows(SafetensorsWriter& w, size_t first_spec, size_t r0, const float* rows, int n, int cols,
                          int bits, int group, const std::string& what) {
  QuantBuffer q;
  try {
    q = quantize(rows, n, cols, bits, group);
  } catch (const Error& e) {
    fail("{}: {}", what, e.what());
  }
  const size_t q_row = q.view().row_bytes(), s_row = size_t(q.view().groups_per_row()) * 2;
  w.write(first_spec, r0 * q_row, q.q.data(), q.q.size());
  w.write(first_spec + 1, r0 * s_row, q.scales.data(), q.scales.size() * 2);
  w.write(first_spec + 2, r0 * s_row, q.biases.data(), q.biases.size() * 2);
}

void put_projection(const ProjLayout& pl, const float* w, uint8_t* rec, const std::string& what) {
  const size_t n = size_t(pl.rows) * size_t(pl.cols);
  if (pl.bits == kRawBits) {
    auto* out = reinterpret_cast<uint16_t*>(rec + pl.q_offset);
    for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(w[i]);
    return;
  }
  QuantBuffer q;
  try {
    q = quantize(w, pl.rows, pl.cols, pl.bits, pl.group);
  } catch (const Error& e) {
    fail("{}: {}", what, e.what());
  }
  std::memcpy(rec + pl.q_offset, q.q.data(), pl.q_bytes);
  std::memcpy(rec + pl.scales_offset, q.scales.data(), pl.scales_bytes);
  std::memcpy(rec + pl.biases_offset, q.biases.data(), pl.scales_bytes);
}

void write_expert_blob(const fs::path& dir, ExpertLayer& layout,
                       const std::function<void(size_t, std::vector<uint8_t>&, std::vector<float>&)>& fill,
                       const std::function<void(size_t)>& done) {
  const std::string path = (dir / layout.file).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  layout.checksums.assign(size_t(layout.n_experts), 0);
  std::mutex error_mu;
  std::exception_ptr error;
  // Experts are independent: each worker makes whole records in its own buffer.
  ThreadPool::global().parallel_for(size_t(layout.n_experts), [&](size_t e0, size_t e1) {
    try {
      std::vector<uint8_t> rec;
      std::vector<float> scratch;
      for (size_t e = e0; e < e1; ++e) {
        rec.assign(layout.stride, 0);
        fill(e, rec, scratch);
        write_record_header(layout, int(e), rec.data());
        layout.checksums[e] = record_checksum(layout, rec.data());
        pwrite_all(fd, rec.data(), rec.size(), e * layout.stride, path);
        done(e);
      }
    } catch (...) {
      std::lock_guard lock(error_mu);
      if (!error) error = std::current_exception();
    }
  });
  const bool synced = ::fdatasync(fd) == 0;
  if (synced) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  const bool closed = ::close(fd) == 0;
  if (error) std::rethrow_exception(error);
  if (!synced || !closed) fail("{}: cannot flush: {}", path, std::strerror(errno));
}

void check_bits(const char* flag, int bits, std::initializer_list<int> allowed) {
  if (std::find(allowed.begin(), allowed.end(), bits) == allowed.end()) {
    std::string list;
    for (int a : allowed) list += (list.empty() ? "" : ", ") + std::to_string(a);
    fail("{}: {} is not one of {}", flag, bits, list);
  }
}

void write_text_file(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot open for writing: {}", path.string(), std::strerror(errno));
  pwrite_all(fd, text.data(), text.size(), 0, path.string());
  if (::fdatasync(fd) != 0 || ::close(fd) != 0) fail("{}: cannot flush: {}", path.string(), std::strerror(errno));
}

}  // namespace ms
