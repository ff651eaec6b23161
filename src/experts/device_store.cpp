#include "experts/device_store.h"

#if MOESTREAM_CUDA
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
    slots_.emplace_back(size_t(cap) * l.stride);
    released_.emplace_back();
  }
  // Pins, then every expert of the layers that hold them all (the all-resident GPU run).
  for (const auto& [layer, experts] : vram.pins)
    for (size_t i = 0; i < index.layers.size(); ++i)
      if (model_layer_of(index.layers[i].name) == layer) {
        if (pools_[i]->pinned() + int(experts.size()) > capacity(int(i)) - vram.top_k)
          fail("{}: pinning {} experts in layer {} leaves fewer than {} of its {} VRAM slots for the others",
               host.index().layers[i].file, experts.size(), index.layers[i].name, vram.top_k, capacity(int(i)));
        acquire(int(i), experts);
        for (int e : experts) pools_[i]->pin(e);
        release(int(i));
      }
  tables_.resize(index.layers.size());
  for (size_t i = 0; i < index.layers.size(); ++i) {
    if (capacity(int(i)) < index.layers[i].n_experts) continue;
    std::vector<int> all(size_t(index.layers[i].n_experts));
    for (int e = 0; e < index.layers[i].n_experts; ++e) all[size_t(e)] = e;
    for (size_t b = 0; b < all.size(); b += size_t(free_capacity(int(i)))) {
      const std::vector<int> part(all.begin() + std::ptrdiff_t(b),
                                  all.begin() + std::ptrdiff_t(std::min(all.size(), b + size_t(free_capacity(int(i))))));
      std::vector<int> unpinned;
      for (int e : part)
        if (pools_[i]->slot_of(e) < 0) unpinned.push_back(e);
      acquire(int(i), unpinned);
      release(int(i));
    }
    std::vector<const uint8_t*> table;
    for (int e = 0; e < index.layers[i].n_experts; ++e) table.push_back(slot_data(int(i), pools_[i]->slot_of(e)));
    tables_[i] = cuda::DeviceBuffer::from(table);
  }
  for (auto& p : pools_) p->reset_stats();
  host_.reset_stats();
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
    copies_.bytes += n * stride;
    copies_.copy_s += secs;
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
  for (const auto& s : slots_) b += s.size();
  return b;
}

}  // namespace ms
#endif
