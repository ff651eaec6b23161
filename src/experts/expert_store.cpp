#include "experts/expert_store.h"

#include <algorithm>
#include <cstdlib>

#include "util/error.h"

namespace ms {

int model_layer_of(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::atoi(name.c_str() + prefix.size());
}

int layer_capacity(const StoreOptions& opt, const ExpertLayer& layer) {
  int cap = opt.slots > 0 ? opt.slots : layer.n_experts;
  if (auto it = opt.layer_caps.find(model_layer_of(layer.name)); it != opt.layer_caps.end()) cap = it->second;
  return std::min(cap, layer.n_experts);
}

ExpertStore::ExpertStore(const std::string& dir, const EngineIndex& index, const StoreOptions& opt)
    : files_(dir, index, opt.io, opt.direct_io, opt.verify), opt_(opt) {
  for (const ExpertLayer& l : index.layers)
    pools_.push_back(std::make_unique<ExpertPool>(l.n_experts, layer_capacity(opt, l), l.stride, opt.policy, opt.cache));
  for (const auto& [layer, experts] : opt.pins)
    for (size_t i = 0; i < index.layers.size(); ++i)
      if (model_layer_of(index.layers[i].name) == layer) pin(int(i), experts);
}

ExpertStore::~ExpertStore() = default;

int ExpertStore::layer_of(const std::string& name) const {
  for (size_t i = 0; i < index().layers.size(); ++i)
    if (index().layers[i].name == name) return int(i);
  fail("{}: no expert layer '{}' in {}", files_.dir(), name, kEngineIndexFile);
}

std::vector<const uint8_t*> ExpertStore::acquire(int layer, const std::vector<int>& experts) {
  ExpertPool& pool = *pools_[size_t(layer)];
  std::vector<ExpertPool::Miss> misses;
  std::vector<int> slots = pool.acquire(experts, &misses);
  if (!misses.empty()) {
    std::vector<int> ids;
    std::vector<uint8_t*> dsts;
    for (auto m : misses) ids.push_back(m.expert), dsts.push_back(pool.slot_data(m.slot));
    ReadResult r;
    try {
      r = files_.read(layer, ids, dsts);
    } catch (...) {
      for (auto m : misses) pool.abandon(m.expert, m.slot);
      pool.release();
      throw;
    }
    // The compute thread waits for the whole batch: read time and stall are the same here.
    pool.add_io(r.bytes, r.seconds, r.seconds);
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
    fail("{}: pinning {} experts in layer {} leaves fewer than {} of its {} slots for the others", files_.dir(), experts.size(),
         index().layers[size_t(layer)].name, opt_.top_k, pool.capacity());
  acquire(layer, experts);
  for (int e : experts) pool.pin(e);
  release(layer);
}

std::vector<LayerStats> ExpertStore::stats() const {
  std::vector<LayerStats> r;
  for (size_t i = 0; i < pools_.size(); ++i)
    r.push_back({index().layers[i].name, pools_[i]->capacity(), pools_[i]->resident(), pools_[i]->slot_bytes(), pools_[i]->stats()});
  return r;
}

void ExpertStore::reset_stats() {
  for (auto& p : pools_) p->reset_stats();
}

size_t ExpertStore::resident_bytes() const {
  size_t b = 0;
  for (auto& p : pools_) b += size_t(p->capacity()) * p->slot_bytes();
  return b;
}

}  // namespace ms
