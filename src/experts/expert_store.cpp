#include "experts/expert_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "util/error.h"

namespace ms {

namespace fs = std::filesystem;

int model_layer_of(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::atoi(name.c_str() + prefix.size());
}

namespace {

int open_blob(const std::string& path, bool direct) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0 && direct && errno == EINVAL) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // no O_DIRECT here (tmpfs)
  if (fd < 0) fail("{}: cannot open expert blob: {}", path, std::strerror(errno));
  return fd;
}

}  // namespace

ExpertStore::ExpertStore(const std::string& dir, const EngineIndex& index, const StoreOptions& opt)
    : dir_(dir), index_(index), opt_(opt), io_(make_io_engine(opt.io)) {
  try {
    for (const ExpertLayer& l : index_.layers) {
      const std::string path = (fs::path(dir) / l.file).string();
      fds_.push_back(open_blob(path, opt.direct_io));
      const uint64_t need = uint64_t(l.n_experts) * l.stride;
      if (fs::file_size(path) < need)
        fail("{}: expert blob of layer {} is {} bytes, the index needs {} ({} experts x {} bytes)", path, l.name,
             fs::file_size(path), need, l.n_experts, l.stride);
      int cap = opt.slots > 0 ? opt.slots : l.n_experts;
      if (auto it = opt.layer_caps.find(model_layer_of(l.name)); it != opt.layer_caps.end()) cap = it->second;
      pools_.push_back(std::make_unique<ExpertPool>(l.n_experts, std::min(cap, l.n_experts), l.stride, opt.policy));
    }
    for (const auto& [layer, experts] : opt.pins)
      for (size_t i = 0; i < index_.layers.size(); ++i)
        if (model_layer_of(index_.layers[i].name) == layer) pin(int(i), experts);
  } catch (...) {
    for (int fd : fds_) ::close(fd);
    throw;
  }
}

ExpertStore::~ExpertStore() {
  for (int fd : fds_) ::close(fd);
}

int ExpertStore::layer_of(const std::string& name) const {
  for (size_t i = 0; i < index_.layers.size(); ++i)
    if (index_.layers[i].name == name) return int(i);
  fail("{}: no expert layer '{}' in {}", dir_, name, kEngineIndexFile);
}

std::vector<const uint8_t*> ExpertStore::acquire(int layer, const std::vector<int>& experts) {
  ExpertPool& pool = *pools_[size_t(layer)];
  const ExpertLayer& l = index_.layers[size_t(layer)];
  std::vector<ExpertPool::Miss> misses;
  std::vector<int> slots = pool.acquire(experts, &misses);
  if (!misses.empty()) {
    std::vector<ReadOp> ops;
    for (auto m : misses) ops.push_back({fds_[size_t(layer)], uint64_t(m.expert) * l.stride, l.stride, pool.slot_data(m.slot)});
    const auto start = std::chrono::steady_clock::now();
    {
      std::lock_guard lk(io_mu_);
      io_->read_all(ops);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    uint64_t bytes = 0;
    std::string error;
    for (size_t i = 0; i < misses.size(); ++i) {
      const auto m = misses[i];
      const std::string where = fmt::format("{}: layer {}, expert {}", (fs::path(dir_) / l.file).string(), l.name, m.expert);
      if (error.empty() && ops[i].result < 0) error = fmt::format("{}: read failed: {}", where, std::strerror(int(-ops[i].result)));
      else if (error.empty() && uint64_t(ops[i].result) < l.record_bytes)
        error = fmt::format("{}: short read ({} of {} bytes): the blob is truncated", where, ops[i].result, l.record_bytes);
      else if (error.empty() && opt_.verify && record_checksum(pool.slot_data(m.slot), l.record_bytes) != l.checksums[size_t(m.expert)])
        error = fmt::format("{}: checksum mismatch: the record is corrupt", where);
      bytes += uint64_t(std::max<int64_t>(0, ops[i].result));
    }
    // The compute thread waits for the whole batch: read time and stall are the same here.
    pool.add_io(bytes, secs, secs);
    if (!error.empty()) {
      for (auto m : misses) pool.abandon(m.expert, m.slot);
      pool.release();
      fail("{}", error);
    }
    for (auto m : misses) pool.publish(m.expert, m.slot);
  }
  std::vector<const uint8_t*> records;
  for (int s : slots) records.push_back(pool.slot_data(s));
  return records;
}

void ExpertStore::release(int layer) { pools_[size_t(layer)]->release(); }

void ExpertStore::pin(int layer, const std::vector<int>& experts) {
  ExpertPool& pool = *pools_[size_t(layer)];
  // At least one token's worth of slots must stay free for the experts that are not pinned.
  if (pool.pinned() + int(experts.size()) > pool.capacity() - opt_.top_k)
    fail("{}: pinning {} experts in layer {} leaves fewer than {} of its {} slots for the others", dir_, experts.size(),
         index_.layers[size_t(layer)].name, opt_.top_k, pool.capacity());
  acquire(layer, experts);
  for (int e : experts) pool.pin(e);
  release(layer);
}

std::vector<LayerStats> ExpertStore::stats() const {
  std::vector<LayerStats> r;
  for (size_t i = 0; i < pools_.size(); ++i)
    r.push_back({index_.layers[i].name, pools_[i]->capacity(), pools_[i]->resident(), pools_[i]->slot_bytes(), pools_[i]->stats()});
  return r;
}

size_t ExpertStore::resident_bytes() const {
  size_t b = 0;
  for (auto& p : pools_) b += size_t(p->capacity()) * p->slot_bytes();
  return b;
}

}  // namespace ms
