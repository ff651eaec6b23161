#include "backends/cuda/device_store.h"

#include <algorithm>
#include <chrono>

#include "util/error.h"

namespace ms {

DeviceExpertStore::DeviceExpertStore(ExpertStore& host, const StoreOptions& vram) : host_(host) {
  const EngineIndex& index = host.index();
  for (size_t i = 0; i < index.layers.size(); ++i) {
    const ExpertLayer& l = index.layers[i];
    pinned_host_.emplace_back(host.slot_memory(int(i)), size_t(host.capacity(int(i))) * l.stride);
    const int cap = layer_capacity(vram, l);
    pools_.push_back(std::make_unique<ExpertPool>(l.n_experts, cap, 0, vram.policy));
    slots_.emplace_back(size_t(cap) * l.stride, cuda::DeviceAlloc::Now);
    released_.emplace_back();
  }
  // A promoted prefetch may leave a host slot's record in the staging area.
  if (host.staging_bytes() > 0) pinned_host_.emplace_back(host.staging_memory(), host.staging_bytes());
  for (const auto& [layer, experts] : vram.pins)
    for (size_t i = 0; i < index.layers.size(); ++i)
      if (model_layer_of(index.layers[i].name) == layer) pin(int(i), experts, vram.top_k);
  tables_.resize(index.layers.size());
  for (size_t i = 0; i < index.layers.size(); ++i)
    if (capacity(int(i)) == index.layers[i].n_experts) load_whole_layer(int(i));
  for (auto& p : pools_) p->reset_stats();
  host_.reset_stats();
}

void DeviceExpertStore::pin(int layer, const std::vector<int>& experts, int top_k) {
  ExpertPool& pool = *pools_[size_t(layer)];
  if (pool.pinned() + int(experts.size()) > capacity(layer) - top_k)
    fail("pinning {} experts in layer {} leaves fewer than {} of its {} VRAM slots for the others", experts.size(),
         host_.index().layers[size_t(layer)].name, top_k, capacity(layer));
  acquire(layer, experts);
  for (int e : experts) pool.pin(e);
  release(layer);
}

// A pool as large as its layer never evicts: every expert is read now and found by the table.
void DeviceExpertStore::load_whole_layer(int layer) {
  ExpertPool& pool = *pools_[size_t(layer)];
  std::vector<int> absent;
  for (int e = 0; e < pool.n_experts(); ++e)
    if (pool.slot_of(e) < 0) absent.push_back(e);
  acquire(layer, absent);
  release(layer);
  std::vector<const uint8_t*> table;
  for (int e = 0; e < pool.n_experts(); ++e) table.push_back(slot_data(layer, pool.slot_of(e)));
  tables_[size_t(layer)] = cuda::DeviceArray<const uint8_t*>::from(table, cuda::DeviceAlloc::Now);
}

std::vector<const uint8_t*> DeviceExpertStore::acquire(int layer, const std::vector<int>& experts) {
  ExpertPool& pool = *pools_[size_t(layer)];
  std::vector<ExpertPool::Miss> misses;
  std::vector<int> slots = pool.acquire(experts, &misses);
  if (!misses.empty()) {
    const auto start = std::chrono::steady_clock::now();
    try {
      fill(layer, misses);
    } catch (...) {
      for (auto m : misses) pool.abandon(m.expert, m.slot);
      pool.release();
      throw;
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    pool.add_io(0, 0, waited);
    for (auto m : misses) pool.publish(m.expert, m.slot);
  }
  std::vector<const uint8_t*> records;
  for (int s : slots) records.push_back(slot_data(layer, s));
  return records;
}

// The misses come up from the host tier in pieces of what its slots can hold at once; each
// piece's copies finish before its host slots are released to the next piece or layer.
void DeviceExpertStore::fill(int layer, const std::vector<ExpertPool::Miss>& misses) {
  const size_t piece = size_t(std::max(1, host_.free_capacity(layer)));
  const size_t stride = host_.index().layers[size_t(layer)].stride;
  for (size_t b = 0; b < misses.size(); b += piece) {
    const size_t n = std::min(misses.size(), b + piece) - b;
    std::vector<int> ids;
    for (size_t j = 0; j < n; ++j) ids.push_back(misses[b + j].expert);
    const std::vector<const uint8_t*> records = host_.acquire(layer, ids);
    double secs = 0;
    try {
      copy_.begin(released_[size_t(layer)]);
      for (size_t j = 0; j < n; ++j) copy_.copy(slot_data(layer, misses[b + j].slot), records[j], stride);
      copy_.end();
      secs = copy_.finish();
    } catch (...) {
      host_.release(layer);
      throw;
    }
    host_.release(layer);
    pools_[size_t(layer)]->add_io(n * stride, secs, 0);
  }
}

void DeviceExpertStore::release(int layer) {
  released_[size_t(layer)].record();
  pools_[size_t(layer)]->release();
}

std::vector<LayerStats> DeviceExpertStore::stats() const {
  std::vector<LayerStats> r;
  for (size_t i = 0; i < pools_.size(); ++i)
    r.push_back({host_.index().layers[i].name, pools_[i]->capacity(), pools_[i]->resident(), host_.index().layers[i].stride,
                 pools_[i]->stats()});
  return r;
}

size_t DeviceExpertStore::resident_bytes() const {
  size_t b = 0;
  for (const auto& s : slots_) b += s.bytes();
  return b;
}

}  // namespace ms
