#include "format/engine_dir.h"

#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace ms {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

bool valid_bits(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 8 || bits == kRawBits; }

ProjLayout place_projection(const std::string& where, const ProjSpec& s, size_t& offset) {
  if (!valid_bits(s.bits)) fail("{}: bits {} is not one of 2, 3, 4, 8, 16", where, s.bits);
  if (s.rows <= 0 || s.cols <= 0) fail("{}: shape [{}, {}] is empty", where, s.rows, s.cols);
  ProjLayout p{s.bits, s.bits == kRawBits ? 0 : s.group, s.rows, s.cols};
  if (s.bits != kRawBits) {
    if (s.group != 32 && s.group != 64 && s.group != 128) fail("{}: group {} is not one of 32, 64, 128", where, s.group);
    if (s.cols % s.group != 0)
      fail("{}: {} input columns are not a multiple of the group size {} (choose a smaller --expert-group)", where,
           s.cols, s.group);
  }
  p.q_offset = offset = align_up(offset, kRecordRegionAlign);
  p.q_bytes = s.bits == kRawBits ? size_t(s.rows) * size_t(s.cols) * 2 : size_t(s.rows) * (size_t(s.cols) * size_t(s.bits) / 8);
  offset += p.q_bytes;
  if (s.bits != kRawBits) {
    p.scales_bytes = size_t(s.rows) * size_t(s.cols / s.group) * 2;
    p.scales_offset = offset = align_up(offset, kRecordRegionAlign);
    offset += p.scales_bytes;
    p.biases_offset = offset = align_up(offset, kRecordRegionAlign);
    offset += p.scales_bytes;
  }
  return p;
}

json proj_json(const ProjLayout& p) {
  return {{"bits", p.bits},         {"group", p.group},     {"rows", p.rows},
          {"cols", p.cols},         {"q_offset", p.q_offset}, {"q_bytes", p.q_bytes},
          {"scales_offset", p.scales_offset}, {"biases_offset", p.biases_offset}, {"scales_bytes", p.scales_bytes}};
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

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
    if (!v.is_number_integer()) fail("{}: {}: field '{}' is {}, expected an integer", file_, where_, key, v.dump());
    return v.get<int64_t>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) fail("{}: {}: field '{}' is {}, expected a string", file_, where_, key, v.dump());
    return v.get<std::string>();
  }
  Fields object(const char* key) const { return Fields(at(key), file_, where_ + "." + key); }
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

ExpertLayer read_layer(const Fields& f) {
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
  }
  // The layout is a function of the shapes: recompute it and require the stored one to agree,
  // so a reader never trusts an offset it could not have computed itself.
  const std::string where = fmt::format("{}: layer {}", f.file(), l.name);
  ExpertLayer plan;
  try {
    plan = plan_expert_layer(l.name, l.file, l.n_experts, spec);
  } catch (const Error& e) {
    fail("{}: {}", f.file(), e.what());
  }
  for (size_t i = 0; i < 3; ++i) {
    const json stored = projs.at(kExpertProjections[i]);
    const json want = proj_json(plan.proj[i]);
    for (auto& [key, v] : want.items())
      if (stored.value(key, json()) != v)
        fail("{}: projection {}: {} is {}, expected {} for this shape and bit width", where, kExpertProjections[i], key,
             stored.value(key, json()).dump(), v.dump());
  }
  if (uint64_t(f.integer("record_bytes")) != plan.record_bytes)
    fail("{}: record_bytes is {}, expected {}", where, f.integer("record_bytes"), plan.record_bytes);
  if (uint64_t(f.integer("stride")) != plan.stride)
    fail("{}: stride is {}, expected {} (record_bytes rounded up to {})", where, f.integer("stride"), plan.stride,
         kExpertStrideAlign);
  const json& sums = f.at("checksums");
  if (!sums.is_array() || sums.size() != size_t(l.n_experts))
    fail("{}: checksums must be a list of {} hex strings (one per expert)", where, l.n_experts);
  for (size_t e = 0; e < sums.size(); ++e) {
    const std::string s = sums[e].is_string() ? sums[e].get<std::string>() : "";
    if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail("{}: checksums[{}] is {}, expected 16 lowercase hex digits", where, e, sums[e].dump());
    plan.checksums.push_back(std::stoull(s, nullptr, 16));
  }
  return plan;
}

}  // namespace

ExpertLayer plan_expert_layer(const std::string& name, const std::string& file, int n_experts,
                              const std::array<ProjSpec, 3>& spec) {
  if (n_experts <= 0) fail("{}: n_experts {} must be positive", name, n_experts);
  ExpertLayer l;
  l.name = name;
  l.file = file;
  l.n_experts = n_experts;
  size_t offset = 0;
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

uint64_t record_checksum(const void* data, size_t n) { return XXH64(data, n, 0); }

const ExpertLayer* EngineIndex::find(const std::string& name) const {
  for (auto& l : layers)
    if (l.name == name) return &l;
  return nullptr;
}

std::string engine_index_json(const EngineIndex& index, const ModelConfig& cfg) {
  json layers = json::array();
  for (auto& l : index.layers) {
    json projs = json::object();
    for (size_t i = 0; i < 3; ++i) projs[kExpertProjections[i]] = proj_json(l.proj[i]);
    json sums = json::array();
    for (uint64_t c : l.checksums) sums.push_back(hex64(c));
    layers.push_back({{"name", l.name},
                      {"file", l.file},
                      {"n_experts", l.n_experts},
                      {"record_bytes", l.record_bytes},
                      {"stride", l.stride},
                      {"projections", projs},
                      {"checksums", sums}});
  }
  const json j = {{"format", kEngineFormatName},
                  {"version", kEngineFormatVersion},
                  {"architecture", index.architecture},
                  {"dims", dims_json(cfg)},
                  {"dense", {{"file", kEngineDenseFile}, {"bits", index.dense_bits}, {"group", index.dense_group}}},
                  {"expert_layers", layers}};
  return j.dump(1) + "\n";
}

bool is_engine_dir(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / kEngineIndexFile); }

EngineIndex read_engine_index(const std::string& dir, const ModelConfig& cfg) {
  const std::string path = (fs::path(dir) / kEngineIndexFile).string();
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", path, e.what());
  }
  const Fields f(j, path, "index");
  if (f.string("format") != kEngineFormatName)
    fail("{}: format is '{}', expected '{}'", path, f.string("format"), kEngineFormatName);
  if (f.integer("version") != kEngineFormatVersion)
    fail("{}: format version {} is not supported (this build reads version {}; convert the checkpoint again)", path,
         f.integer("version"), kEngineFormatVersion);
  EngineIndex index;
  index.architecture = f.string("architecture");
  if (index.architecture != cfg.architecture)
    fail("{}: architecture '{}' differs from config.json's '{}'", path, index.architecture, cfg.architecture);
  const json want_dims = dims_json(cfg);
  const json& dims = f.at("dims");
  for (auto& [key, v] : want_dims.items())
    if (!dims.is_object() || dims.value(key, json()) != v)
      fail("{}: dims.{} is {}, but config.json gives {}", path, key, dims.is_object() ? dims.value(key, json()).dump() : "missing",
           v.dump());
  const Fields dense = f.object("dense");
  index.dense_bits = int(dense.integer("bits"));
  index.dense_group = int(dense.integer("group"));
  const json& layers = f.at("expert_layers");
  if (!layers.is_array()) fail("{}: expert_layers is not a list", path);
  for (size_t i = 0; i < layers.size(); ++i)
    index.layers.push_back(read_layer(Fields(layers[i], path, fmt::format("expert_layers[{}]", i))));
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
  return maps_[i]->data() + size_t(e) * layer.stride;
}

void ExpertBlobs::verify(const ExpertLayer& layer, int e) const {
  const uint64_t got = record_checksum(record(layer, e), layer.record_bytes);
  if (got != layer.checksums[size_t(e)])
    fail("{}: layer {}: expert {}: checksum {} does not match the index ({}); the file is corrupt",
         (fs::path(dir_) / layer.file).string(), layer.name, e, hex64(got), hex64(layer.checksums[size_t(e)]));
}

}  // namespace ms
