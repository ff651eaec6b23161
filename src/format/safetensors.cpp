#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/half.h"
#include "util/json.h"

namespace ms {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2}, {DType::F32, "F32", 4},
    {DType::I8, "I8", 1},     {DType::I16, "I16", 2}, {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},   {DType::U8, "U8", 1},   {DType::U32, "U32", 4},
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + (s[i] < 0 ? std::string("*") : std::to_string(s[i]));
  return r + "]";
}
}  // namespace

const char* dtype_name(DType t) {
  for (auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}
size_t dtype_size(DType t) {
  for (auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}
bool parse_dtype(const std::string& s, DType* out) {
  for (auto& d : kDTypes)
    if (s == d.name) {
      *out = d.type;
      return true;
    }
  return false;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void TensorView::expect(DType t, const std::vector<int64_t>& want) const {
  bool ok = shape.size() == want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || want[i] == shape[i];
  if (t != dtype)
    fail("{}: tensor '{}' has dtype {}, expected {}", file, name, dtype_name(dtype), dtype_name(t));
  if (!ok) fail("{}: tensor '{}' has shape {}, expected {}", file, name, shape_str(shape), shape_str(want));
}

namespace {
template <class T>
T load_unaligned(const void* base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + i * sizeof(T), sizeof(T));
  return v;
}
}  // namespace

std::vector<float> TensorView::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  switch (dtype) {
    case DType::F32:
      std::memcpy(out.data(), data, out.size() * 4);
      break;
    // Element by element through memcpy: a file whose header is not padded puts the data at
    // any address, where a typed read would be misaligned.
    case DType::BF16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(load_unaligned<bf16>(data, i));
      break;
    case DType::F16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = f16_to_f32(load_unaligned<f16>(data, i));
      break;
    default:
      fail("{}: tensor '{}' has dtype {}, expected a floating-point type", file, name, dtype_name(dtype));
  }
  return out;
}

MappedFile::MappedFile(const std::string& path, Residence residence) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0 && residence == Residence::Memory) {
    try {
      memory_ = ResidentMemory(size_, "resident weights");
      // In chunks, each chunk's page cache dropped once copied: under a memory cap the file's
      // bytes are never held twice (the copy and the page cache) for more than one chunk.
      constexpr size_t kChunk = size_t(4) << 20;
      for (size_t done = 0; done < size_;) {
        const size_t want = std::min(kChunk, size_ - done);
        const ssize_t n = ::pread(fd, memory_.data() + done, want, off_t(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("{}: cannot read: {}", path, n < 0 ? std::strerror(errno) : "the file shrank while it was read");
        posix_fadvise(fd, off_t(done), off_t(n), POSIX_FADV_DONTNEED);
        done += size_t(n);
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    data_ = memory_.data();
  } else if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("{}: cannot mmap: {}", path, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ && !memory_.data()) munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {

// One tensor's header entry: dtype, a shape whose byte count does not overflow, and
// data_offsets inside the data section that give exactly that many bytes.
TensorView read_entry(const std::string& path, const std::string& name, const json& v, size_t data_size) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    fail("{}: tensor '{}': header entry needs dtype, shape and data_offsets", path, name);
  TensorView t;
  t.name = name;
  t.file = path;
  if (!v["dtype"].is_string() || !parse_dtype(v["dtype"].get<std::string>(), &t.dtype))
    fail("{}: tensor '{}': unknown dtype {}", path, name, json_summary(v["dtype"]));
  const json& shape = v["shape"];
  if (!shape.is_array()) fail("{}: tensor '{}': shape is not an array", path, name);
  size_t want = dtype_size(t.dtype);
  for (auto& d : shape) {
    if (!d.is_number_unsigned()) fail("{}: tensor '{}': shape {} is not a list of sizes", path, name, json_summary(shape));
    const uint64_t n = d.get<uint64_t>();
    // A byte count that overflowed could wrap around to match the data_offsets.
    if (n > uint64_t(INT64_MAX) || __builtin_mul_overflow(want, n, &want) || want > uint64_t(INT64_MAX))
      fail("{}: tensor '{}': shape {} is too large", path, name, json_summary(shape));
    t.shape.push_back(int64_t(n));
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    fail("{}: tensor '{}': data_offsets {} must be two byte offsets", path, name, json_summary(off));
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (begin > end || end > data_size)
    fail("{}: tensor '{}': data_offsets [{}, {}] out of bounds (data section is {} bytes)", path, name, begin, end,
         data_size);
  t.nbytes = size_t(end - begin);
  if (t.nbytes != want)
    fail("{}: tensor '{}': {} {} needs {} bytes, data_offsets give {}", path, name, dtype_name(t.dtype),
         shape_str(t.shape), want, t.nbytes);
  return t;
}

// The tensors tile the data section exactly, as the format requires: no overlap (two tensors
// sharing bytes) and no hole or tail (bytes no tensor owns, where anything could hide).
void check_tiling(const std::string& path, std::vector<std::pair<size_t, const TensorView*>> extents, size_t data_size) {
  std::sort(extents.begin(), extents.end(), [](auto& a, auto& b) { return a.first < b.first; });
  size_t at = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    const auto [begin, t] = extents[i];
    if (begin < at) fail("{}: tensors '{}' and '{}' overlap in the data section", path, extents[i - 1].second->name, t->name);
    if (begin > at)
      fail("{}: tensor '{}': data_offsets begin at {}, but the previous tensor ends at {} (a hole in the data section)",
           path, t->name, begin, at);
    at = begin + t->nbytes;
  }
  if (at != data_size)
    fail("{}: the tensors end at byte {} of the data section, but it has {} bytes (trailing bytes)", path, at, data_size);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path, Residence residence) : map_(path, residence) {
  const size_t size = map_.size();
  if (size < 8) fail("{}: truncated safetensors file ({} bytes, the header length alone needs 8)", path, size);
  uint64_t header_len;
  std::memcpy(&header_len, map_.data(), 8);
  if (header_len > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", path, header_len, size);
  const std::string_view text(reinterpret_cast<const char*>(map_.data()) + 8, header_len);
  const json header = parse_json(text, path + " (header)", {.reject_duplicate_keys = true});
  if (!header.is_object()) fail("{}: JSON header is not an object", path);
  data_begin_ = 8 + header_len;
  const size_t data_size = size - data_begin_;

  std::vector<std::pair<size_t, const TensorView*>> extents;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ is {}, expected an object of strings", path, json_summary(v));
      for (auto& [k, m] : v.items())
        if (m.is_string()) metadata_[k] = m.get<std::string>();  // only string values are metadata
      continue;
    }
    TensorView t = read_entry(path, name, v, data_size);
    const size_t begin = v["data_offsets"][0].get<size_t>();
    t.data = map_.data() + data_begin_ + begin;
    auto [it, inserted] = tensors_.emplace(name, std::move(t));
    // A 0-byte tensor owns no bytes; writers give it the offset where the next tensor begins.
    if (it->second.nbytes > 0) extents.push_back({begin, &it->second});
  }
  check_tiling(path, std::move(extents), data_size);
}

TensorStore TensorStore::open(const std::string& path, Residence residence) {
  TensorStore s;
  s.where_ = path;
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    fs::path index = fs::path(path) / "model.safetensors.index.json";
    fs::path single = fs::path(path) / "model.safetensors";
    if (fs::exists(index)) {
      const json j = parse_json_file(index.string(), {.reject_duplicate_keys = true});
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        fail("{}: field 'weight_map' missing or not an object", index.string());
      for (auto& [tensor, file] : j["weight_map"].items()) {
        if (!file.is_string()) fail("{}: weight_map['{}'] is not a file name", index.string(), tensor);
        const fs::path rel = file.get<std::string>();
        if (rel.empty() || rel.is_absolute() || std::find(rel.begin(), rel.end(), "..") != rel.end())
          fail("{}: weight_map['{}'] is '{}', expected a file name inside the checkpoint directory", index.string(), tensor,
               rel.string().substr(0, 200));
        std::string f = (fs::path(path) / file.get<std::string>()).string();
        if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
      }
      for (auto& f : files)
        if (!fs::exists(f)) fail("{}: shard {} named in the index is missing", index.string(), f);
    } else if (fs::exists(single)) {
      files.push_back(single.string());
    } else {
      fail("{}: no model.safetensors or model.safetensors.index.json", path);
    }
  } else {
    files.push_back(path);
  }
  for (auto& f : files) {
    s.files_.push_back(std::make_unique<SafetensorsFile>(f, residence));
    for (auto& [name, t] : s.files_.back()->tensors()) {
      if (s.index_.count(name)) fail("{}: tensor '{}' appears in two shards ({} and {})", path, name, s.index_[name]->file, f);
      s.index_[name] = &t;
    }
  }
  return s;
}

const TensorView& TensorStore::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("{}: missing tensor '{}'", where_, name);
  return *it->second;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> r;
  for (auto& [n, _] : index_) r.push_back(n);
  return r;
}

TensorData make_f32_tensor(const std::string& name, std::vector<int64_t> shape, const float* v) {
  TensorData t{name, DType::F32, std::move(shape), {}};
  size_t n = 1;
  for (auto d : t.shape) n *= size_t(d);
  t.bytes.resize(n * 4);
  std::memcpy(t.bytes.data(), v, n * 4);
  return t;
}

void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors) {
  json header = json::object();
  size_t offset = 0;
  for (auto& t : tensors) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("{}: cannot open for writing", tmp);
    uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), std::streamsize(h.size()));
    for (auto& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
    if (!out) fail("{}: write failed", tmp);
  }
  fs::rename(tmp, path);
}

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (auto d : shape) n *= size_t(d);
  return n;
}

void pwrite_all(int fd, const void* data, size_t n, size_t offset, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("{}: write of {} bytes at offset {} failed: {}", path, n, offset, std::strerror(errno));
    p += w, n -= size_t(w), offset += size_t(w);
  }
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<TensorSpec>& specs) : path_(path) {
  json header = json::object();
  size_t offset = 0;
  for (auto& t : specs) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes()}}};
    begin_.push_back(offset);
    size_.push_back(t.nbytes());
    offset += t.nbytes();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  for (auto& b : begin_) b += 8 + h.size();
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  const uint64_t n = h.size();
  pwrite_all(fd_, &n, 8, 0, path_);
  pwrite_all(fd_, h.data(), h.size(), 8, path_);
  if (::ftruncate(fd_, off_t(8 + h.size() + offset)) != 0) fail("{}: cannot set size: {}", path, std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(size_t i, size_t offset, const void* data, size_t n) {
  if (offset + n > size_.at(i)) fail("{}: write past the end of tensor {} ({} + {} > {} bytes)", path_, i, offset, n, size_[i]);
  pwrite_all(fd_, data, n, begin_[i] + offset, path_);
}

void SafetensorsWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::fdatasync(fd) != 0 || ::close(fd) != 0) fail("{}: cannot flush: {}", path_, std::strerror(errno));
}

}  // namespace ms
