#include "format/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "util/error.h"

namespace ms {

using json = nlohmann::json;

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxCount = uint64_t(1) << 24;  // tensors, keys, array items: far beyond any model
constexpr int kMaxDims = 4;

enum ValueType : uint32_t { U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };

// Sequential reads from the mapped bytes, each checked against the end.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path) : p_(data), size_(size), path_(path) {}

  template <class T>
  T get(const char* what) {
    T v;
    need(sizeof(T), what);
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    if (n > (uint64_t(1) << 30)) fail("{}: {} claims a string of {} bytes", path_, what, n);
    need(size_t(n), what);
    std::string s(reinterpret_cast<const char*>(p_ + at_), size_t(n));
    at_ += size_t(n);
    return s;
  }
  size_t at() const { return at_; }

 private:
  void need(size_t n, const char* what) const {
    if (n > size_ - at_) fail("{}: truncated: the file ends inside {} (at byte {} of {})", path_, what, at_, size_);
  }
  const uint8_t* p_;
  size_t size_, at_ = 0;
  const std::string& path_;
};

json read_value(Cursor& c, uint32_t type, const std::string& key, const std::string& path, int depth = 0) {
  const char* what = "a metadata value";
  switch (type) {
    case U8: return c.get<uint8_t>(what);
    case I8: return c.get<int8_t>(what);
    case U16: return c.get<uint16_t>(what);
    case I16: return c.get<int16_t>(what);
    case U32: return c.get<uint32_t>(what);
    case I32: return c.get<int32_t>(what);
    case F32: return c.get<float>(what);
    case BOOL: return c.get<uint8_t>(what) != 0;
    case STRING: return c.str(what);
    case U64: return c.get<uint64_t>(what);
    case I64: return c.get<int64_t>(what);
    case F64: return c.get<double>(what);
    case ARRAY: {
      if (depth > 0) fail("{}: metadata key '{}' nests arrays", path, key);
      const uint32_t item = c.get<uint32_t>(what);
      const uint64_t n = c.get<uint64_t>(what);
      if (n > kMaxCount) fail("{}: metadata key '{}' claims {} items", path, key, n);
      json a = json::array();
      for (uint64_t i = 0; i < n; ++i) a.push_back(read_value(c, item, key, path, depth + 1));
      return a;
    }
    default: fail("{}: metadata key '{}' has unknown value type {}", path, key, type);
  }
}

}  // namespace

int64_t GgufTensor::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
  return r;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    fail("{}: empty or unreadable", path);
  }
  f->size_ = size_t(st.st_size);
  f->map_ = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (f->map_ == MAP_FAILED) {
    f->map_ = nullptr;
    fail("{}: cannot map: {}", path, std::strerror(errno));
  }
  const auto* base = static_cast<const uint8_t*>(f->map_);
  Cursor c(base, f->size_, f->path_);
  if (c.get<uint32_t>("the magic") != kMagic) fail("{}: not a GGUF file (no 'GGUF' magic)", path);
  const uint32_t version = c.get<uint32_t>("the version");
  if (version != 2 && version != 3) fail("{}: GGUF version {} is not supported (2 or 3)", path, version);
  const uint64_t n_tensors = c.get<uint64_t>("the tensor count"), n_kv = c.get<uint64_t>("the metadata count");
  if (n_tensors > kMaxCount || n_kv > kMaxCount) fail("{}: claims {} tensors and {} metadata keys", path, n_tensors, n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.str("a metadata key");
    const uint32_t type = c.get<uint32_t>("a metadata type");
    if (f->meta_.count(key)) fail("{}: metadata key '{}' appears twice", path, key);
    f->meta_[key] = read_value(c, type, key, path);
  }
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.str("a tensor name");
    const uint32_t dims = c.get<uint32_t>("a tensor's dimension count");
    if (dims == 0 || dims > kMaxDims) fail("{}: tensor '{}' has {} dimensions", path, t.name, dims);
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t n = c.get<uint64_t>("a tensor's shape");
      if (n == 0 || n > (uint64_t(1) << 40)) fail("{}: tensor '{}' has dimension {} of size {}", path, t.name, d, n);
      t.ne.push_back(int64_t(n));
    }
    t.type = c.get<uint32_t>("a tensor's type");
    offsets.push_back(c.get<uint64_t>("a tensor's offset"));
    if (f->index_.count(t.name)) fail("{}: tensor '{}' appears twice", path, t.name);
    f->index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }
  uint64_t alignment = 32;
  if (f->has("general.alignment")) {
    alignment = uint64_t(f->integer("general.alignment"));
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > 65536)
      fail("{}: general.alignment {} is not a power of two", path, alignment);
  }
  const uint64_t data_start = (uint64_t(c.at()) + alignment - 1) / alignment * alignment;
  for (size_t i = 0; i < f->tensors_.size(); ++i) {
    GgufTensor& t = f->tensors_[i];
    int values = 0, bytes = 0;
    if (!ggml_type_info(t.type, &values, &bytes))
      fail("{}: tensor '{}' has ggml {}, which the importer does not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
           "Q8_0, Q4_K, Q5_K, Q6_K)",
           path, t.name, ggml_type_name(t.type));
    double elements = 1;
    for (int64_t n : t.ne) elements *= double(n);
    if (elements > double(f->size_) * 8) fail("{}: truncated: tensor '{}' claims {:.0f} values", path, t.name, elements);
    if (t.ne[0] % values != 0)
      fail("{}: tensor '{}' rows of {} values are not whole {}-value blocks of {}", path, t.name, t.ne[0], values,
           ggml_type_name(t.type));
    const double total = double(t.ne[0] / values) * bytes * double(t.rows());
    if (total > double(f->size_)) fail("{}: truncated: tensor '{}' needs {:.0f} bytes", path, t.name, total);
    t.nbytes = size_t(t.ne[0] / values) * size_t(bytes) * size_t(t.rows());
    if (offsets[i] % alignment != 0) fail("{}: tensor '{}' offset {} is not aligned to {}", path, t.name, offsets[i], alignment);
    const uint64_t begin = data_start + std::min<uint64_t>(offsets[i], f->size_);  // no wrap past 2^64
    if (offsets[i] > f->size_ || begin > f->size_ || t.nbytes > f->size_ - begin)
      fail("{}: truncated: tensor '{}' ends at byte {} of a {}-byte file", path, t.name, begin + t.nbytes, f->size_);
    t.data = base + begin;
  }
  return f;
}

GgufFile::~GgufFile() {
  if (map_) munmap(map_, size_);
}

const json& GgufFile::meta(const std::string& key) const {
  auto it = meta_.find(key);
  if (it == meta_.end()) fail("{}: metadata key '{}' is missing", path_, key);
  return it->second;
}

int64_t GgufFile::integer(const std::string& key) const {
  const json& v = meta(key);
  if (!v.is_number_integer()) fail("{}: metadata key '{}' is {}, expected an integer", path_, key, v.dump().substr(0, 40));
  return v.get<int64_t>();
}

double GgufFile::number(const std::string& key) const {
  const json& v = meta(key);
  if (!v.is_number()) fail("{}: metadata key '{}' is {}, expected a number", path_, key, v.dump().substr(0, 40));
  return v.get<double>();
}

std::string GgufFile::string(const std::string& key) const {
  const json& v = meta(key);
  if (!v.is_string()) fail("{}: metadata key '{}' is {}, expected a string", path_, key, v.dump().substr(0, 40));
  return v.get<std::string>();
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("{}: tensor '{}' is missing", path_, name);
  return tensors_[it->second];
}

void GgufFile::release(const GgufTensor& t) const {
  if (t.nbytes == 0) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data) & ~(page - 1);
  madvise(reinterpret_cast<void*>(begin), reinterpret_cast<uintptr_t>(t.data) + t.nbytes - begin, MADV_DONTNEED);
}

}  // namespace ms
