#include "format/engine_dir.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <set>

#include "format/checksum.h"
#include "util/error.h"
#include "util/json.h"

namespace ms {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

bool valid_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8 || bits == kRawBits;
}

// Bounds that keep every record, stride and blob size far from size_t overflow (a 2^20 x 2^20
// bf16 projection is 2 TiB; real experts are a few MiB).
constexpr int kMaxProjectionDim = 1 << 20;
constexpr int kMaxExperts = 1 << 16;

ProjLayout place_projection(const std::string& where, const ProjSpec& s, size_t& offset) {
  if (!valid_bits(s.bits)) fail("{}: bits {} is not one of 2, 3, 4, 5, 6, 8, 16", where, s.bits);
  if (s.rows <= 0 || s.cols <= 0) fail("{}: shape [{}, {}] is empty", where, s.rows, s.cols);
  if (s.rows > kMaxProjectionDim || s.cols > kMaxProjectionDim)
    fail("{}: shape [{}, {}] is larger than {} in a dimension", where, s.rows, s.cols, kMaxProjectionDim);
  ProjLayout p{s.bits, s.bits == kRawBits ? 0 : s.group, s.rows, s.cols};
  p.scale_type = s.bits == kRawBits ? ScaleType::BF16 : s.scale_type;
  if (s.bits != kRawBits) {
    if (s.group != 32 && s.group != 64 && s.group != 128 && !(s.group == 16 && s.bits >= 4))
      fail("{}: group {} is not one of 32, 64, 128 (or 16 with 4 or more bits)", where, s.group);
    if (s.cols % s.group != 0)
      fail("{}: {} input columns are not a multiple of the group size {} (choose a smaller --expert-group)", where,
           s.cols, s.group);
  }
  p.q_offset = offset = align_up(offset, kRecordRegionAlign);
  p.q_bytes = s.bits == kRawBits ? size_t(s.rows) * size_t(s.cols) * 2 : size_t(s.rows) * (size_t(s.cols) * size_t(s.bits) / 8);
  offset += p.q_bytes;
  if (s.bits != kRawBits) {
    p.scales_bytes = size_t(s.rows) * size_t(s.cols / s.group) * scale_size(p.scale_type);
    p.scales_offset = offset = align_up(offset, kRecordRegionAlign);
    offset += p.scales_bytes;
    p.biases_offset = offset = align_up(offset, kRecordRegionAlign);
    offset += p.scales_bytes;
  }
  return p;
}

// `scales` is written only where it is not bf16, so directories without imports keep their bytes.
json proj_json(const ProjLayout& p) {
  json j = {{"bits", p.bits},         {"group", p.group},     {"rows", p.rows},
            {"cols", p.cols},         {"q_offset", p.q_offset}, {"q_bytes", p.q_bytes},
            {"scales_offset", p.scales_offset}, {"biases_offset", p.biases_offset}, {"scales_bytes", p.scales_bytes}};
  if (p.scale_type != ScaleType::BF16) j["scales"] = scale_type_name(p.scale_type);
  return j;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

uint64_t parse_hex64(const json& v, const std::string& where, const std::string& field) {
  const std::string s = v.is_string() ? v.get<std::string>() : "";
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail("{}: {} is {}, expected 16 lowercase hex digits", where, field, json_summary(v));
  return std::stoull(s, nullptr, 16);
}

// Typed access to a JSON object's fields, naming the file and the path inside it on error.
class Fields {
 public:
  Fields(const json& j, std::string file, std::string where) : j_(j), file_(std::move(file)), where_(std::move(where)) {
    if (!j_.is_object()) fail("{}: {} is not an object", file_, where_);
  }
  const json& at(const char* key) const {
    if (!j_.contains(key)) fail("{}: {}: required field '{}' is missing", file_, where_, key);
    return j_[key];
  }
  int64_t integer(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_integer()) fail("{}: {}: field '{}' is {}, expected an integer", file_, where_, key, json_summary(v));
    return v.get<int64_t>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) fail("{}: {}: field '{}' is {}, expected a string", file_, where_, key, json_summary(v));
    return v.get<std::string>();
  }
  Fields object(const char* key) const { return Fields(at(key), file_, where_ + "." + key); }
  bool has(const char* key) const { return j_.contains(key); }
  const std::string& file() const { return file_; }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string file_, where_;
};

json dims_json(const ModelConfig& cfg) {
  return {{"hidden_size", cfg.hidden},      {"num_hidden_layers", cfg.n_layers}, {"vocab_size", cfg.vocab},
          {"num_experts", cfg.n_experts},   {"num_experts_per_tok", cfg.top_k},  {"moe_intermediate_size", cfg.moe_inter},
          {"shared_expert_intermediate_size", cfg.shared_inter}};
}

// The layer's experts and projection shapes are config.json's: checked before anything is
// computed from them (a stride from forged rows and cols would size a pool or a file).
void check_layer_shape(const Fields& f, const std::string& name, int64_t n_experts, const std::array<ProjSpec, 3>& spec,
                       const ModelConfig& cfg) {
  if (n_experts != cfg.n_experts)
    fail("{}: {}: layer {} has n_experts {}, config.json's num_experts is {}", f.file(), f.where(), name, n_experts,
         cfg.n_experts);
  const int want[3][2] = {{cfg.moe_inter, cfg.hidden}, {cfg.moe_inter, cfg.hidden}, {cfg.hidden, cfg.moe_inter}};
  for (size_t i = 0; i < 3; ++i)
    if (spec[i].rows != want[i][0] || spec[i].cols != want[i][1])
      fail("{}: {}: layer {}: projection {} is [{}, {}], config.json gives [{}, {}]", f.file(), f.where(), name,
           kExpertProjections[i], spec[i].rows, spec[i].cols, want[i][0], want[i][1]);
}

ExpertLayer read_layer(const Fields& f, int version, const ModelConfig& cfg) {
  ExpertLayer l;
  l.name = f.string("name");
  l.file = f.string("file");
  const int64_t n = f.integer("n_experts");
  if (n <= 0 || n > INT32_MAX) fail("{}: {}: n_experts {} is out of range", f.file(), f.where(), n);
  l.n_experts = int(n);
  std::array<ProjSpec, 3> spec;
  const Fields projs = f.object("projections");
  for (size_t i = 0; i < 3; ++i) {
    const Fields p = projs.object(kExpertProjections[i]);
    auto small = [&](const char* key) {
      const int64_t v = p.integer(key);
      if (v < 0 || v > INT32_MAX) fail("{}: {}: {} {} is out of range", p.file(), p.where(), key, v);
      return int(v);
    };
    spec[i] = {small("bits"), small("group"), small("rows"), small("cols")};
    if (p.has("scales")) {
      const std::string t = p.string("scales");
      if (!parse_scale_type(t, &spec[i].scale_type) || t == "bf16")
        fail("{}: {}: scales '{}' is not f16 or f32 (bf16 is written by leaving it out)", p.file(), p.where(), t);
    }
  }
  check_layer_shape(f, l.name, n, spec, cfg);
  // The layout is a function of the shapes: recompute it and require the stored one to agree,
  // so a reader never trusts an offset it could not have computed itself.
  const std::string where = fmt::format("{}: layer {}", f.file(), l.name);
  ExpertLayer plan;
  try {
    plan = plan_expert_layer(l.name, l.file, l.n_experts, spec, version);
  } catch (const Error& e) {
    fail("{}: {}", f.file(), e.what());
  }
  for (size_t i = 0; i < 3; ++i) {
    const json stored = projs.at(kExpertProjections[i]);
    const json want = proj_json(plan.proj[i]);
    for (auto& [key, v] : want.items())
      if (stored.value(key, json()) != v)
        fail("{}: projection {}: {} is {}, expected {} for this shape and bit width", where, kExpertProjections[i], key,
             json_summary(stored.value(key, json())), json_summary(v));
  }
  if (version >= 2 && uint64_t(f.integer("header_bytes")) != plan.header_bytes)
    fail("{}: header_bytes is {}, expected {} (format version {})", where, f.integer("header_bytes"), plan.header_bytes,
         version);
  if (uint64_t(f.integer("record_bytes")) != plan.record_bytes)
    fail("{}: record_bytes is {}, expected {}", where, f.integer("record_bytes"), plan.record_bytes);
  if (uint64_t(f.integer("stride")) != plan.stride)
    fail("{}: stride is {}, expected {} (record_bytes rounded up to {})", where, f.integer("stride"), plan.stride,
         kExpertStrideAlign);
  const json& sums = f.at("checksums");
  if (!sums.is_array() || sums.size() != size_t(l.n_experts))
    fail("{}: checksums must be a list of {} hex strings (one per expert)", where, l.n_experts);
  for (size_t e = 0; e < sums.size(); ++e) plan.checksums.push_back(parse_hex64(sums[e], where, fmt::format("checksums[{}]", e)));
  return plan;
}

}  // namespace

ExpertLayer plan_expert_layer(const std::string& name, const std::string& file, int n_experts,
                              const std::array<ProjSpec, 3>& spec, int version) {
  if (n_experts <= 0 || n_experts > kMaxExperts) fail("{}: n_experts {} must be in [1, {}]", name, n_experts, kMaxExperts);
  if (version < kOldestEngineFormatVersion || version > kEngineFormatVersion)
    fail("{}: format version {} is not one of {} to {}", name, version, kOldestEngineFormatVersion, kEngineFormatVersion);
  ExpertLayer l;
  l.name = name;
  l.file = file;
  l.n_experts = n_experts;
  l.version = version;
  l.header_bytes = version >= 2 ? kRecordHeaderBytes : 0;
  size_t offset = l.header_bytes;
  for (size_t i = 0; i < 3; ++i)
    l.proj[i] = place_projection(fmt::format("{}: projection {}", name, kExpertProjections[i]), spec[i], offset);
  l.record_bytes = offset;
  l.stride = align_up(offset, kExpertStrideAlign);
  return l;
}

std::string expert_file_name(const std::string& name) {
  // "model.layers.3.mlp" / "mtp.layers.0.mlp": the layer number sits after "layers.".
  const size_t at = name.find("layers.");
  if (at == std::string::npos) fail("MoE block '{}' has no layer number", name);
  const int layer = std::stoi(name.substr(at + 7));
  return fmt::format("experts/{}layer_{:03d}.bin", name.rfind("mtp.", 0) == 0 ? "mtp_" : "", layer);
}

uint64_t content_checksum(int version, const void* data, size_t n) {
  return version >= 3 ? xxh3_64(data, n) : XXH64(data, n, 0);
}

uint64_t record_checksum(const ExpertLayer& layer, const void* rec) {
  return content_checksum(layer.version, rec, layer.record_bytes);
}

size_t EngineIndex::widest_stride() const {
  size_t widest = 0;
  for (const ExpertLayer& l : layers) widest = std::max(widest, size_t(l.stride));
  return widest;
}

const ExpertLayer* EngineIndex::find(const std::string& name) const {
  for (auto& l : layers)
    if (l.name == name) return &l;
  return nullptr;
}

namespace {

// The header's fields end here; the rest of its kRecordHeaderBytes is zero.
constexpr size_t kHeaderFieldBytes = offsetof(RecordHeader, n_experts) + sizeof(uint32_t);
static_assert(offsetof(RecordHeader, version) == 8 && offsetof(RecordHeader, expert) == 12 &&
              offsetof(RecordHeader, layer_hash) == 16 && offsetof(RecordHeader, record_bytes) == 24 &&
              offsetof(RecordHeader, n_experts) == 32 && kHeaderFieldBytes <= kRecordHeaderBytes);

RecordHeader header_of(const uint8_t* rec) {
  RecordHeader h;
  std::memcpy(&h, rec, kHeaderFieldBytes);
  return h;
}

// What a record that is not expert e of its layer holds, for the error message.
std::string record_owner(const EngineIndex& index, const RecordHeader& h) {
  for (const ExpertLayer& l : index.layers)
    if (layer_name_hash(l.name) == h.layer_hash) return fmt::format("expert {} of layer {}", h.expert, l.name);
  return fmt::format("expert {} of a layer not in this directory (name hash {})", h.expert, hex64(h.layer_hash));
}

json dense_json(const EngineIndex& index) {
  json d = {{"file", kEngineDenseFile}, {"bits", index.dense_bits}, {"group", index.dense_group}};
  if (index.version < 2) return d;
  json sums = json::object();
  for (const auto& [name, sum] : index.dense_checksums.tensors) sums[name] = hex64(sum);
  d["header_checksum"] = hex64(index.dense_checksums.header);
  d["checksums"] = sums;
  return d;
}

void read_dense(const Fields& f, EngineIndex& index) {
  const Fields dense = f.object("dense");
  if (dense.string("file") != kEngineDenseFile)
    fail("{}: dense.file is '{}', expected '{}'", f.file(), dense.string("file").substr(0, 200), kEngineDenseFile);
  const int64_t bits = dense.integer("bits"), group = dense.integer("group");
  if (bits != kRawBits && bits != 8 && bits != 4) fail("{}: dense.bits {} is not one of 16, 8, 4", f.file(), bits);
  if (bits == kRawBits ? group != 0 : group != 32 && group != 64 && group != 128)
    fail("{}: dense.group {} is not {} for dense.bits {}", f.file(), group, bits == kRawBits ? "0" : "one of 32, 64, 128",
         bits);
  index.dense_bits = int(bits);
  index.dense_group = int(group);
  if (index.version < 2) return;
  index.dense_checksums.header = parse_hex64(dense.at("header_checksum"), f.file(), "dense.header_checksum");
  const json& sums = dense.at("checksums");
  if (!sums.is_object()) fail("{}: dense.checksums is not an object of tensor name -> checksum", f.file());
  for (const auto& [name, v] : sums.items())
    index.dense_checksums.tensors[name] = parse_hex64(v, f.file(), fmt::format("dense.checksums['{}']", name.substr(0, 200)));
}

// "model.layers.N.mlp" of a MoE layer N of cfg, or "mtp.layers.0.mlp" (Qwen3-Next's MTP head):
// a layer the model does not have is refused (a num_hidden_layers smaller than the conversion).
void check_layer_name(const std::string& path, const std::string& where, const std::string& name, const ModelConfig& cfg) {
  if (name == "mtp.layers.0.mlp" && cfg.arch == Arch::Qwen3Next) return;
  const std::string prefix = "model.layers.", suffix = ".mlp";
  const bool shaped = name.size() > prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
                      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string number = shaped ? name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()) : "";
  if (number.empty() || number.size() > 6 || number.find_first_not_of("0123456789") != std::string::npos)
    fail("{}: {}: name '{}' is not a MoE block (model.layers.N.mlp)", path, where, name.substr(0, 200));
  const int layer = std::stoi(number);
  if (layer >= cfg.n_layers)
    fail("{}: {}: layer {} is past config.json's num_hidden_layers {}", path, where, name, cfg.n_layers);
  if (size_t(layer) >= cfg.layer_moe.size() || !cfg.is_moe(layer)) fail("{}: {}: layer {} is a dense layer in config.json, not a MoE one", path, where, name);
}

// A blob `file` must name a file inside dir: relative, no "..", and not a symlink that leads out.
fs::path check_blob_path(const std::string& dir, const std::string& path, const std::string& where, const std::string& file) {
  const fs::path rel(file);
  if (file.empty() || rel.is_absolute() || std::find(rel.begin(), rel.end(), "..") != rel.end())
    fail("{}: {}: file '{}' must be a relative path inside the directory, without '..'", path, where, file.substr(0, 200));
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(fs::path(dir), ec);
  const fs::path real = fs::weakly_canonical(fs::path(dir) / rel, ec);
  const fs::path inside = real.lexically_relative(root);
  if (ec || inside.empty() || *inside.begin() == ".." || inside == ".")
    fail("{}: {}: file '{}' resolves to {}, outside the directory {}", path, where, file, real.string(), root.string());
  return real;
}

}  // namespace

uint64_t layer_name_hash(const std::string& name) { return XXH64(name.data(), name.size(), 0); }

void write_record_header(const ExpertLayer& layer, int e, uint8_t* rec) {
  if (layer.header_bytes == 0) return;
  RecordHeader h;
  std::memcpy(h.magic, kRecordMagic, sizeof kRecordMagic);
  h.version = uint32_t(layer.version);
  h.expert = uint32_t(e);
  h.layer_hash = layer_name_hash(layer.name);
  h.record_bytes = layer.record_bytes;
  h.n_experts = uint32_t(layer.n_experts);
  std::memset(rec, 0, layer.header_bytes);
  std::memcpy(rec, &h, kHeaderFieldBytes);
}

void check_record_header(const EngineIndex& index, const ExpertLayer& layer, int e, const uint8_t* rec,
                         const std::string& file) {
  if (layer.header_bytes == 0) return;
  const RecordHeader h = header_of(rec);
  const auto where = [&] { return fmt::format("{}: layer {}, expert {}", file, layer.name, e); };
  if (std::memcmp(h.magic, kRecordMagic, sizeof kRecordMagic) != 0 || h.version != uint32_t(layer.version))
    fail("{}: the record does not start with a version-{} record header: the blob is corrupt or not of this conversion",
         where(), layer.version);
  if (h.layer_hash != layer_name_hash(layer.name) || h.expert != uint32_t(e))
    fail("{}: the record read holds {}: the blob is misplaced or swapped", where(), record_owner(index, h));
  bool zero = true;
  for (size_t i = kHeaderFieldBytes; i < layer.header_bytes; ++i) zero = zero && rec[i] == 0;
  if (h.record_bytes != layer.record_bytes || h.n_experts != uint32_t(layer.n_experts) || !zero)
    fail("{}: the record header gives record_bytes {} and n_experts {} (reserved bytes {}), the index {} and {}: the "
         "blob is corrupt",
         where(), h.record_bytes, h.n_experts, zero ? "zero" : "not zero", layer.record_bytes, layer.n_experts);
}

namespace {

// content_checksum of a version over bytes given in pieces.
class ContentHasher {
 public:
  explicit ContentHasher(int version) : v3_(version >= 3) {
    if (v3_ ? !(s3_ = XXH3_createState()) : !(s64_ = XXH64_createState())) fail("out of memory for a checksum state");
  }
  ~ContentHasher() { v3_ ? XXH3_freeState(s3_) : XXH64_freeState(s64_); }
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;
  void reset() { v3_ ? XXH3_64bits_reset(s3_) : XXH64_reset(s64_, 0); }
  void update(const void* p, size_t n) { v3_ ? XXH3_64bits_update(s3_, p, n) : XXH64_update(s64_, p, n); }
  uint64_t digest() const { return v3_ ? XXH3_64bits_digest(s3_) : XXH64_digest(s64_); }

 private:
  bool v3_;
  XXH3_state_t* s3_ = nullptr;
  XXH64_state_t* s64_ = nullptr;
};

}  // namespace

DenseChecksums dense_checksums(const std::string& path, int version) {
  const SafetensorsFile file(path);
  DenseChecksums sums;
  sums.header = content_checksum(version, file.file_data(), file.data_begin());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  std::vector<uint8_t> buf(size_t(4) << 20);
  try {
    ContentHasher hasher(version);
    for (const auto& [name, t] : file.tensors()) {
      hasher.reset();
      const size_t begin = size_t(static_cast<const uint8_t*>(t.data) - file.file_data());
      for (size_t done = 0; done < t.nbytes;) {
        const size_t n = std::min(buf.size(), t.nbytes - done);
        const ssize_t got = ::pread(fd, buf.data(), n, off_t(begin + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) fail("{}: tensor '{}': read failed: {}", path, name, got < 0 ? std::strerror(errno) : "end of file");
        hasher.update(buf.data(), size_t(got));
        done += size_t(got);
      }
      sums.tensors[name] = hasher.digest();
      posix_fadvise(fd, off_t(begin), off_t(t.nbytes), POSIX_FADV_DONTNEED);
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return sums;
}

DenseChecksums dense_checksums(const SafetensorsFile& file, int version) {
  DenseChecksums sums;
  sums.header = content_checksum(version, file.file_data(), file.data_begin());
  for (const auto& [name, t] : file.tensors()) sums.tensors[name] = content_checksum(version, t.data, t.nbytes);
  return sums;
}

void verify_dense(const SafetensorsFile& dense, const EngineIndex& index) {
  if (index.version < 2) return;
  const std::string& path = dense.path();
  const DenseChecksums got = dense_checksums(dense, index.version);
  const DenseChecksums& want = index.dense_checksums;
  if (got.header != want.header)
    fail("{}: header checksum {} does not match {}'s ({}): the tensor list, a dtype, shape or offset was changed", path,
         hex64(got.header), kEngineIndexFile, hex64(want.header));
  for (const auto& [name, sum] : want.tensors) {
    const auto it = got.tensors.find(name);
    if (it == got.tensors.end()) fail("{}: tensor '{}' that {} lists is missing", path, name, kEngineIndexFile);
    if (it->second != sum)
      fail("{}: tensor '{}': checksum {} does not match {}'s ({}); the file is corrupt", path, name, hex64(it->second),
           kEngineIndexFile, hex64(sum));
  }
  for (const auto& [name, sum] : got.tensors)
    if (!want.tensors.count(name)) fail("{}: tensor '{}' is not listed in {}'s dense.checksums", path, name, kEngineIndexFile);
}

std::string engine_index_json(const EngineIndex& index, const ModelConfig& cfg) {
  json layers = json::array();
  for (auto& l : index.layers) {
    json projs = json::object();
    for (size_t i = 0; i < 3; ++i) projs[kExpertProjections[i]] = proj_json(l.proj[i]);
    json sums = json::array();
    for (uint64_t c : l.checksums) sums.push_back(hex64(c));
    json layer = {{"name", l.name},         {"file", l.file},     {"n_experts", l.n_experts},
                  {"record_bytes", l.record_bytes}, {"stride", l.stride}, {"projections", projs},
                  {"checksums", sums}};
    if (index.version >= 2) layer["header_bytes"] = l.header_bytes;
    layers.push_back(layer);
  }
  const json j = {{"format", kEngineFormatName},  {"version", index.version}, {"architecture", index.architecture},
                  {"dims", dims_json(cfg)},       {"dense", dense_json(index)}, {"expert_layers", layers}};
  return j.dump(1) + "\n";
}

bool is_engine_dir(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / kEngineIndexFile); }

std::vector<std::string> engine_dir_files(const std::string& dir, const EngineIndex& index) {
  std::vector<std::string> files;
  for (const char* f : kEngineSideFiles)
    if (fs::exists(fs::path(dir) / f)) files.emplace_back(f);
  files.emplace_back(kEngineIndexFile);
  files.emplace_back(kEngineDenseFile);
  for (const ExpertLayer& l : index.layers) files.push_back(l.file);
  return files;
}

EngineIndex read_engine_index(const std::string& dir, const ModelConfig& cfg) {
  const std::string path = (fs::path(dir) / kEngineIndexFile).string();
  const json j = parse_json_file(path, {.reject_duplicate_keys = true});
  const Fields f(j, path, "index");
  if (f.string("format") != kEngineFormatName)
    fail("{}: format is '{}', expected '{}'", path, f.string("format").substr(0, 80), kEngineFormatName);
  const int64_t version = f.integer("version");
  if (version < kOldestEngineFormatVersion || version > kEngineFormatVersion)
    fail("{}: format version {} is not supported (this build reads versions {} to {}; convert the checkpoint again)", path,
         version, kOldestEngineFormatVersion, kEngineFormatVersion);
  EngineIndex index;
  index.version = int(version);
  index.architecture = f.string("architecture");
  if (index.architecture != cfg.architecture)
    fail("{}: architecture '{}' differs from config.json's '{}'", path, index.architecture.substr(0, 80), cfg.architecture);
  const json want_dims = dims_json(cfg);
  const json& dims = f.at("dims");
  for (auto& [key, v] : want_dims.items())
    if (!dims.is_object() || dims.value(key, json()) != v)
      fail("{}: dims.{} is {}, but config.json gives {}", path, key,
           dims.is_object() ? json_summary(dims.value(key, json())) : "missing", json_summary(v));
  read_dense(f, index);
  const json& layers = f.at("expert_layers");
  if (!layers.is_array()) fail("{}: expert_layers is not a list", path);
  std::set<std::string> names;
  std::set<fs::path> files;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string where = fmt::format("expert_layers[{}]", i);
    ExpertLayer l = read_layer(Fields(layers[i], path, where), index.version, cfg);
    check_layer_name(path, where, l.name, cfg);
    if (!names.insert(l.name).second) fail("{}: {}: layer {} is listed twice", path, where, l.name);
    if (!files.insert(check_blob_path(dir, path, where, l.file)).second)
      fail("{}: {}: file '{}' is the blob of another layer too", path, where, l.file);
    index.layers.push_back(std::move(l));
  }
  return index;
}

ExpertBlobs::ExpertBlobs(const std::string& dir, const EngineIndex& index) : dir_(dir), index_(index) {
  for (auto& l : index_.layers) {
    const std::string path = (fs::path(dir) / l.file).string();
    if (!fs::exists(path)) fail("{}: expert blob of layer {} is missing", path, l.name);
    maps_.push_back(std::make_unique<MappedFile>(path));
    const size_t want = size_t(l.n_experts) * l.stride;
    if (maps_.back()->size() != want)
      fail("{}: layer {}: file is {} bytes, expected {} ({} experts × stride {}); truncated or from another conversion", path,
           l.name, maps_.back()->size(), want, l.n_experts, l.stride);
  }
}

const uint8_t* ExpertBlobs::record(const ExpertLayer& layer, int e) const {
  const size_t i = size_t(&layer - index_.layers.data());
  if (i >= index_.layers.size()) fail("expert layer {} is not part of this engine directory", layer.name);
  if (e < 0 || e >= layer.n_experts) fail("{}: layer {}: expert {} out of range [0, {})", layer.file, layer.name, e, layer.n_experts);
  const uint8_t* rec = maps_[i]->data() + size_t(e) * layer.stride;
  check_record_header(index_, layer, e, rec, (fs::path(dir_) / layer.file).string());
  return rec;
}

void ExpertBlobs::verify(const ExpertLayer& layer, int e) const {
  const uint64_t got = record_checksum(layer, record(layer, e));
  if (got != layer.checksums[size_t(e)])
    fail("{}: layer {}: expert {}: checksum {} does not match the index ({}); the file is corrupt",
         (fs::path(dir_) / layer.file).string(), layer.name, e, hex64(got), hex64(layer.checksums[size_t(e)]));
}

}  // namespace ms
