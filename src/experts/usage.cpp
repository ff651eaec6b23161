#include "experts/usage.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "util/error.h"

namespace ms {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "moestream-usage";
constexpr int kVersion = 1;

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

// The history in `j`, checked against `index`: throws a message saying what is wrong.
UsageHistory parse(const json& j, const EngineIndex& index) {
  if (!j.is_object() || j.value("format", "") != kFormat) fail("it is not a usage history (its format is not \"{}\")", kFormat);
  if (j.value("version", 0) != kVersion) fail("it is version {} (this build reads {})", j.value("version", 0), kVersion);
  UsageHistory h = empty_usage(index);
  if (j.value("model", "") != hex(h.model)) fail("it belongs to another model ({}, this one is {})", j.value("model", ""), hex(h.model));
  const json& layers = j.at("layers");
  if (!layers.is_array() || layers.size() != index.layers.size())
    fail("it has {} expert layers, the model {}", layers.is_array() ? layers.size() : 0, index.layers.size());
  for (size_t l = 0; l < index.layers.size(); ++l) {
    const json& lj = layers[l];
    if (lj.at("name") != index.layers[l].name) fail("layer {} is \"{}\", the model's \"{}\"", l, lj.at("name").dump(), index.layers[l].name);
    const json& c = lj.at("counts");
    if (!c.is_array() || c.size() != h.counts[l].size())
      fail("layer {} has {} experts, the model's {}", index.layers[l].name, c.is_array() ? c.size() : 0, h.counts[l].size());
    for (size_t e = 0; e < c.size(); ++e) {
      const double v = c[e].get<double>();
      if (!(v >= 0) || !std::isfinite(v)) fail("layer {} expert {}: count {}", index.layers[l].name, e, c[e].dump());
      h.counts[l][e] = v;
    }
  }
  h.runs = j.at("runs").get<uint64_t>();
  return h;
}

}  // namespace

bool UsageHistory::empty() const {
  for (const auto& c : counts)
    for (double v : c)
      if (v > 0) return false;
  return true;
}

void UsageHistory::merge(const UsageHistory& run, double decay) {
  if (run.model != model || run.counts.size() != counts.size()) fail("merging the usage of another model");
  for (size_t l = 0; l < counts.size(); ++l) {
    if (run.counts[l].size() != counts[l].size()) fail("merging the usage of another model");
    for (size_t e = 0; e < counts[l].size(); ++e) counts[l][e] = counts[l][e] * decay + run.counts[l][e];
  }
  runs += run.runs;
}

std::vector<int> UsageHistory::hottest(size_t l, int n) const {
  const std::vector<double>& c = counts[l];
  std::vector<int> ids(c.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return c[size_t(a)] > c[size_t(b)]; });
  while (!ids.empty() && c[size_t(ids.back())] <= 0) ids.pop_back();
  if (int(ids.size()) > n) ids.resize(size_t(std::max(0, n)));
  return ids;
}

uint64_t usage_fingerprint(const EngineIndex& index) {
  XXH64_state_t* s = XXH64_createState();
  XXH64_reset(s, 0);
  XXH64_update(s, index.architecture.data(), index.architecture.size());
  for (const ExpertLayer& l : index.layers) {
    XXH64_update(s, l.name.data(), l.name.size() + 1);
    XXH64_update(s, &l.n_experts, sizeof l.n_experts);
    XXH64_update(s, l.checksums.data(), l.checksums.size() * sizeof(uint64_t));
  }
  const uint64_t h = XXH64_digest(s);
  XXH64_freeState(s);
  return h;
}

UsageHistory empty_usage(const EngineIndex& index) {
  UsageHistory h;
  h.model = usage_fingerprint(index);
  for (const ExpertLayer& l : index.layers) {
    h.layers.push_back(l.name);
    h.counts.emplace_back(size_t(l.n_experts), 0.0);
  }
  return h;
}

std::optional<UsageHistory> read_usage(const std::string& path, const EngineIndex& index, std::string* warning) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("it cannot be opened");
    std::stringstream text;
    text << in.rdbuf();
    const json j = json::parse(text.str(), nullptr, false);
    if (j.is_discarded()) fail("it is not valid JSON (truncated or damaged)");
    return parse(j, index);
  } catch (const std::exception& e) {
    *warning = fmt::format("usage history {} ignored: {}", path, e.what());
    return std::nullopt;
  }
}

void write_usage(const std::string& path, const UsageHistory& h) {
  json j = {{"format", kFormat}, {"version", kVersion}, {"model", hex(h.model)}, {"runs", h.runs}};
  json layers = json::array();
  for (size_t l = 0; l < h.layers.size(); ++l) layers.push_back({{"name", h.layers[l]}, {"counts", h.counts[l]}});
  j["layers"] = std::move(layers);
  const std::string text = j.dump();
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const std::string tmp = path + fmt::format(".tmp-{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot write the usage history: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("{}: cannot write the usage history: {}", tmp, std::strerror(err));
    }
    done += size_t(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("{}: cannot write the usage history: {}", path, std::strerror(err));
  }
}

std::string state_dir() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return (fs::path(x) / "moestream").string();
  if (const char* home = std::getenv("HOME"); home && *home) return (fs::path(home) / ".local/state/moestream").string();
  return "/tmp/moestream-state";
}

std::string default_usage_path(const EngineIndex& index) {
  return (fs::path(state_dir()) / hex(usage_fingerprint(index)) / "usage.json").string();
}

UsageFiles usage_files(const std::string& dir, const EngineIndex& index, const std::string& usage_flag) {
  if (!usage_flag.empty()) return {usage_flag, usage_flag, ""};
  UsageFiles f;
  f.read = f.write = default_usage_path(index);
  std::error_code ec;
  // Where older versions kept the history: usage.json beside the model.
  if (const std::string legacy = (fs::path(dir) / "usage.json").string(); !fs::exists(f.read, ec) && fs::exists(legacy, ec)) {
    f.read = legacy;
    f.note = fmt::format("usage history read from {} (beside the model, where older versions kept it); new history goes to {}",
                         legacy, f.write);
  }
  return f;
}

}  // namespace ms
