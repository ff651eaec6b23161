#include "cli/model_options.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace ms::cli {

namespace {
const char* kDefaultModel = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";

int layer_key(const std::string& path, const char* field, const std::string& k) {
  size_t used = 0;
  int layer = -1;
  try {
    layer = std::stoi(k, &used);
  } catch (const std::exception&) {
  }
  if (layer < 0 || used != k.size()) fail("{}: {} key '{}' is not a layer number", path, field, k);
  return layer;
}

// {"layer_caps": {"0": 40, ...}, "pins": {"0": [3, 17], ...}} (pins optional).
void load_pool_profile(const std::string& path, StoreOptions& o) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open pool profile", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed JSON: {}", path, e.what());
  }
  if (!j.is_object() || !j.contains("layer_caps") || !j["layer_caps"].is_object())
    fail("{}: expected {{\"layer_caps\": {{\"0\": 40, ...}}}}", path);
  for (auto& [k, v] : j["layer_caps"].items()) {
    const int layer = layer_key(path, "layer_caps", k);
    if (!v.is_number_integer() || v.get<int>() <= 0) fail("{}: layer_caps[\"{}\"] is {}, expected a positive integer", path, k, v.dump());
    o.layer_caps[layer] = v.get<int>();
  }
  if (!j.contains("pins")) return;
  if (!j["pins"].is_object()) fail("{}: pins must be an object of layer -> expert ids", path);
  for (auto& [k, v] : j["pins"].items()) {
    const int layer = layer_key(path, "pins", k);
    if (!v.is_array()) fail("{}: pins[\"{}\"] is {}, expected a list of expert ids", path, k, v.dump());
    for (auto& e : v) {
      if (!e.is_number_integer() || e.get<int>() < 0) fail("{}: pins[\"{}\"] holds {}, not an expert id", path, k, e.dump());
      o.pins[layer].push_back(e.get<int>());
    }
  }
}
}  // namespace

uint64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("'{}' is not a size (expected e.g. 8G, 512M)", text);
  }
  std::string unit = text.substr(used);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else fail("'{}' has an unknown unit '{}' (expected K, M, G or T)", text, unit);
  if (!(v > 0) || !std::isfinite(v)) fail("'{}' is not a positive size", text);
  return uint64_t(v * mult);
}

void add_model_options(CLI::App* cmd, ModelArgs& a, bool default_model) {
  auto* m = cmd->add_option("--model", a.model, default_model ? "Model directory (default: the embedded pycoder-moe-q4)" : "Model directory");
  if (default_model) a.model = kDefaultModel;
  else m->required();
  cmd->add_option("--expert-slots", a.expert_slots, "Resident expert slots per MoE layer (default: all)")->check(CLI::PositiveNumber);
  cmd->add_option("--pool-profile", a.pool_profile, "Per-layer slot caps and pinned experts: JSON {\"layer_caps\": {\"0\": 40}, \"pins\": {\"0\": [3, 17]}}");
  cmd->add_option("--memory", a.memory, "Memory budget (e.g. 8G): the expert pools get what dense, KV and activations leave");
  cmd->add_option("--policy", a.policy, "Expert eviction policy")->check(CLI::IsMember({"lru", "lfu", "lrfu"}));
  cmd->add_option("--io", a.io, "Expert reads: io_uring or a pread thread pool")->check(CLI::IsMember({"auto", "uring", "pread"}));
  cmd->add_flag("--no-direct-io", a.no_direct_io, "Read experts through the page cache (no O_DIRECT)");
  cmd->add_flag("--verify", a.verify, "Checksum every expert record read");
  cmd->add_option("--device", a.device, "Where the forward runs: cpu, or cuda (every weight in VRAM; builds with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

ModelOptions model_options(const ModelArgs& a) {
  ModelOptions o;
  o.experts.slots = a.expert_slots;
  if (!a.pool_profile.empty()) load_pool_profile(a.pool_profile, o.experts);
  o.experts.policy = parse_policy(a.policy);
  o.experts.io = parse_io_kind(a.io);
  o.experts.direct_io = !a.no_direct_io;
  o.experts.verify = a.verify;
  if (!a.memory.empty()) o.memory_budget = parse_bytes(a.memory);
  o.device = a.device == "cuda" ? Device::Cuda : Device::Cpu;
  return o;
}

void print_expert_stats(const Model& model, std::FILE* out) {
  const ExpertStore* store = model.experts();
  if (!store) return;
  fmt::print(out, "expert pool ({}, {}):\n", store->io_name(), fmt::format("{} MiB resident", store->resident_bytes() >> 20));
  fmt::print(out, "{:>22} {:>6} {:>9} {:>9} {:>9} {:>7} {:>10} {:>8} {:>8}\n", "layer", "slots", "hits", "misses",
             "evictions", "hit", "read MiB", "read s", "stall s");
  PoolStats total;
  uint64_t all_miss_bytes = 0;
  for (const LayerStats& l : store->stats()) {
    const PoolStats& s = l.pool;
    fmt::print(out, "{:>22} {:>6} {:>9} {:>9} {:>9} {:>7.3f} {:>10.1f} {:>8.3f} {:>8.3f}\n", l.name, l.capacity, s.hits,
               s.misses, s.evictions, s.hit_rate(), double(s.bytes_read) / (1 << 20), s.read_s, s.stall_s);
    total += s;
    all_miss_bytes += (s.hits + s.misses) * l.slot_bytes;
  }
  const double ratio = all_miss_bytes ? double(total.bytes_read) / double(all_miss_bytes) : 0.0;
  const double gbps = total.read_s > 0 ? double(total.bytes_read) / total.read_s / 1e9 : 0.0;
  fmt::print(out, "{:>22} {:>6} {:>9} {:>9} {:>9} {:>7.3f} {:>10.1f} {:>8.3f} {:>8.3f}\n", "total", "", total.hits,
             total.misses, total.evictions, total.hit_rate(), double(total.bytes_read) / (1 << 20), total.read_s,
             total.stall_s);
  fmt::print(out, "disk_load_ratio {:.3f}  read {:.2f} GB/s\n", ratio, gbps);
}

}  // namespace ms::cli
