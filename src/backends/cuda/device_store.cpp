#include "backends/cuda/device_store.h"

#include <algorithm>
#include <chrono>

#include "util/error.h"

namespace ms {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

DeviceExpertStore::DeviceExpertStore(ExpertStore& host, const StoreOptions& vram) : host_(host) {
  const EngineIndex& index = host.index();
  host_fixed_ = host.holds_everything() && !host.prefetching();
  top_k_ = vram.top_k;
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
  measure_h2d();
  if (vram.h2d_rate > 0) {  // paced from here on, and measured again (the pace where too little to measure)
    copy_.pace(vram.h2d_rate, h2d_gb_s_ * 1e9);
    h2d_gb_s_ = 0;
    measure_h2d();
    if (h2d_gb_s_ == 0) h2d_gb_s_ = vram.h2d_rate / 1e9;
  }
  const auto start = std::chrono::steady_clock::now();
  for (const auto& [layer, experts] : vram.pins)
    for (size_t i = 0; i < index.layers.size(); ++i)
      if (model_layer_of(index.layers[i].name) == layer) pin(int(i), experts, vram.top_k);
  tables_.resize(index.layers.size());
  for (size_t i = 0; i < index.layers.size(); ++i)
    if (capacity(int(i)) == index.layers[i].n_experts) load_whole_layer(int(i));
  settle_batch();
  load_.whole = !streams();
  load_.seconds = seconds_since(start);
  load_.bytes = bytes_copied();
  setup_prefetch(vram);
  reset_stats();
}

DeviceExpertStore::~DeviceExpertStore() = default;

// The rate a large pinned host-to-VRAM copy runs at, the second of two (the first pays the
// mappings): the bound a miss's copy is measured against. Up to 256 MiB of the widest layer's
// slots, whose contents are not yet read by anything.
void DeviceExpertStore::measure_h2d() {
  constexpr size_t kMaxBytes = size_t(256) << 20, kMinBytes = size_t(16) << 20;
  size_t best = 0, bytes = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const size_t b = std::min(slots_[i].bytes(), size_t(host_.capacity(int(i))) * host_.index().layers[i].stride);
    if (b > bytes) bytes = b, best = i;
  }
  bytes = std::min(bytes, kMaxBytes);
  if (bytes < kMinBytes) return;
  cuda::ComputeMark none;
  cuda::CopyStream::Times t;
  for (int pass = 0; pass < 2; ++pass) {
    copy_.begin(none);
    copy_.copy(slots_[best].data(), host_.slot_memory(int(best)), bytes);
    copy_.end();
    t = copy_.finish();
  }
  if (t.copy_s > 0) h2d_gb_s_ = double(bytes) / t.copy_s / 1e9;
}

void DeviceExpertStore::setup_prefetch(const StoreOptions& vram) {
  prefetch_stats_.assign(pools_.size(), {});
  placed_.assign(pools_.size(), {});
  const PrefetchOptions& p = vram.prefetch;
  if (p.mode == PrefetchMode::Off || p.staging <= 0 || !streams()) return;
  schedule_ = prefetch_schedule(index(), p);
  if (schedule_.n_targets == 0) return;
  staging_stride_ = index().widest_stride();
  staging_ = cuda::DeviceArray<uint8_t>(size_t(p.staging) * staging_stride_, cuda::DeviceAlloc::Now);
  staged_.assign(size_t(p.staging), {});
  width_ = make_width_controller(p, vram.top_k);
}

void DeviceExpertStore::reset_stats() {
  for (auto& p : pools_) p->reset_stats();
  host_.reset_stats();
  std::lock_guard lk(stats_mu_);
  for (auto& s : prefetch_stats_) s = {};
  for (auto& p : placed_) p = {};
  if (width_) width_->restart_window(behind_);
  window_misses_ = 0;
}

void DeviceExpertStore::warm(const std::vector<std::vector<int>>& hot, bool pin_them) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t l = 0; l < hot.size() && l < pools_.size(); ++l) {
    if (tables_[l].size() > 0 || hot[l].empty()) continue;  // a resident layer holds them all
    if (pin_them) {
      pin(int(l), hot[l], top_k_);
      load_.pinned += int(hot[l].size());
    } else {
      acquire(int(l), hot[l]);
      release(int(l));
    }
    load_.warmed += int(hot[l].size());
  }
  settle_batch();
  load_.seconds += seconds_since(start);
  load_.bytes += bytes_copied();  // since the load's statistics were reset
  reset_stats();
}

uint64_t DeviceExpertStore::bytes_copied() const {
  uint64_t b = 0;
  for (const auto& p : pools_) b += p->stats().bytes_read;
  return b;
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

std::vector<const uint8_t*> DeviceExpertStore::acquire(int layer, const std::vector<int>& experts,
                                                       const ResidentFirst& before_copies) {
  ExpertPool& pool = *pools_[size_t(layer)];
  std::vector<ExpertPool::Miss> misses;
  std::vector<int> slots = pool.acquire(experts, &misses);
  if (!misses.empty()) {
    try {
      if (before_copies) {
        std::vector<const uint8_t*> resident;
        for (size_t i = 0; i < slots.size(); ++i) {
          const bool missed = std::any_of(misses.begin(), misses.end(), [&](const ExpertPool::Miss& m) {
            return m.expert == experts[i];
          });
          resident.push_back(missed ? nullptr : slot_data(layer, slots[i]));
        }
        before_copies(resident);
      }
      fill(layer, misses);
    } catch (...) {
      for (auto m : misses) pool.abandon(m.expert, m.slot);
      pool.release();
      throw;
    }
    for (auto m : misses) pool.publish(m.expert, m.slot);
  }
  std::vector<const uint8_t*> records;
  for (int s : slots) records.push_back(slot_data(layer, s));
  return records;
}

// The misses of one acquire, in one batch of copies on the copy stream: staged ones promoted
// from VRAM staging, the rest copied up from the host tier. Where the host tier's records stay put
// (host_fixed_), the host queues the batch and goes on (the compute stream waits for it, and its
// times are counted at the next batch); else it comes up in pieces of what the host tier's slots
// hold at once, each waited for before its host slots go to the next piece or layer.
void DeviceExpertStore::fill(int layer, const std::vector<ExpertPool::Miss>& misses) {
  settle_batch();
  ExpertPool& pool = *pools_[size_t(layer)];
  const size_t stride = host_.index().layers[size_t(layer)].stride;
  std::vector<ExpertPool::Miss> demand;
  size_t bytes = 0;
  copy_.begin(released_[size_t(layer)]);
  for (const ExpertPool::Miss& m : misses) {
    const int buffer = find_staged(layer, m.expert);
    if (buffer < 0) {
      demand.push_back(m);
      continue;
    }
    // A promotion within VRAM: counted as a prefetch used, not as bytes over the host link
    // (whose rate the pool's bytes and copy time give).
    copy_.copy_on_device(slot_data(layer, m.slot), staging_data(buffer), stride);
    staged_[size_t(buffer)] = {};
    std::lock_guard lk(stats_mu_);
    ++prefetch_stats_[size_t(layer)].used;
  }
  if (!demand.empty() && prefetch_in_flight_) {  // for the width: demand copies queued behind predictions
    if (copy_.marked_done()) prefetch_in_flight_ = false;
    else ++behind_;
  }
  window_misses_ += demand.size();
  const size_t piece = host_fixed_ ? std::max<size_t>(1, demand.size()) : size_t(std::max(1, host_.free_capacity(layer)));
  size_t b = 0;
  do {
    const auto start = std::chrono::steady_clock::now();
    const size_t n = std::min(demand.size(), b + piece) - b;
    if (b > 0) copy_.begin(released_[size_t(layer)]);
    std::vector<int> ids;
    for (size_t j = 0; j < n; ++j) ids.push_back(demand[b + j].expert);
    if (n > 0) {
      settle_prefetch();  // a host read may land where a prediction is still being copied from
      const std::vector<const uint8_t*> records = host_.acquire(layer, ids);
      for (size_t j = 0; j < n; ++j) copy_.copy(slot_data(layer, demand[b + j].slot), records[j], stride);
      bytes += n * stride;
    }
    copy_.end();
    if (host_fixed_) {
      if (n > 0) host_.release(layer);
      pool.add_io(bytes, 0, 0);  // its times once settled
      unsettled_layer_ = layer;
      return;
    }
    cuda::CopyStream::Times t;
    try {
      t = copy_.finish();
    } catch (...) {
      if (n > 0) host_.release(layer);
      throw;
    }
    if (n > 0) host_.release(layer);
    pool.add_io(bytes, t.copy_s, seconds_since(start));
    bytes = 0;
    b += n;
  } while (b < demand.size());
}

// Counts the batch the host did not wait for, waiting for it now (by now it is mostly done).
void DeviceExpertStore::settle_batch() {
  if (unsettled_layer_ < 0) return;
  const cuda::CopyStream::Times t = copy_.finish();
  pools_[size_t(unsettled_layer_)]->add_io(0, t.copy_s, t.stall_s);
  unsettled_layer_ = -1;
}

// Before the host tier may write host memory: predictions copied from its records are done.
void DeviceExpertStore::settle_prefetch() {
  if (host_fixed_ || !prefetch_in_flight_) return;
  copy_.wait_marked();
  prefetch_in_flight_ = false;
}

bool DeviceExpertStore::in_vram(int layer, int expert) const {
  return pools_[size_t(layer)]->slot_of(expert) >= 0 || find_staged(layer, expert) >= 0;
}

std::vector<const uint8_t*> DeviceExpertStore::acquire_host(int layer, const std::vector<int>& experts) {
  settle_prefetch();  // a read may land where a prediction is still being copied from
  return host_.acquire(layer, experts);
}

void DeviceExpertStore::add_placement(int layer, const PlacementStats& p) {
  std::lock_guard lk(stats_mu_);
  placed_[size_t(layer)] += p;
}

void DeviceExpertStore::release(int layer) {
  released_[size_t(layer)].record();
  pools_[size_t(layer)]->release();
}

int DeviceExpertStore::find_staged(int layer, int expert) const {
  for (size_t i = 0; i < staged_.size(); ++i)
    if (staged_[i].layer == layer && staged_[i].expert == expert) return int(i);
  return -1;
}

// A free buffer, else the one staged longest ago (its expert dropped unused: *dropped_layer). A
// buffer whose copies are still queued may be taken: the copy stream runs them in order.
int DeviceExpertStore::take_staging(int* dropped_layer) {
  int best = 0;
  for (size_t i = 0; i < staged_.size(); ++i) {
    if (staged_[i].layer < 0) {
      best = int(i);
      break;
    }
    if (staged_[i].stamp < staged_[size_t(best)].stamp) best = int(i);
  }
  *dropped_layer = staged_[size_t(best)].layer;
  return best;
}

void DeviceExpertStore::prefetch(int layer, const std::vector<int>& experts, int tokens) {
  if (!prefetching()) return;
  ExpertPool& pool = *pools_[size_t(layer)];
  PrefetchStats& st = prefetch_stats_[size_t(layer)];
  const size_t stride = host_.index().layers[size_t(layer)].stride;
  const size_t w = std::min(experts.size(), size_t(width_->width()) * size_t(std::max(1, tokens)));
  std::vector<int> misses, from_disk;
  for (size_t i = 0; i < w; ++i)
    if (pool.slot_of(experts[i]) < 0 && find_staged(layer, experts[i]) < 0) misses.push_back(experts[i]);
  const size_t n_copy = copy_share_ ? std::min(misses.size(), copy_share_(layer, misses, int(w - misses.size()))) : misses.size();
  bool queued = false;
  std::unique_lock lk(stats_mu_);
  st.predicted += w;
  for (size_t i = 0; i < misses.size(); ++i) {
    const int e = misses[i];
    const uint8_t* record = host_.resident_record(layer, e);
    if (i >= n_copy) ++st.for_cpu;
    if (!record) {
      from_disk.push_back(e);
      continue;
    }
    if (i >= n_copy) continue;  // in host memory, where the CPU reads it
    int dropped = -1;
    const int b = take_staging(&dropped);
    if (dropped >= 0) ++prefetch_stats_[size_t(dropped)].wasted;
    staged_[size_t(b)] = {layer, e, ++clock_};
    copy_.copy(staging_data(b), record, stride);
    ++st.issued;
    st.bytes += stride;
    queued = true;
  }
  lk.unlock();
  if (queued) {
    copy_.mark();
    prefetch_in_flight_ = true;
  }
  if (!from_disk.empty() && host_.prefetching()) {
    settle_prefetch();
    host_.prefetch(layer, from_disk, tokens);
  }
  if (++predictions_ >= schedule_.n_targets) adapt_width();
}

void DeviceExpertStore::adapt_width() {
  predictions_ = 0;
  std::lock_guard lk(stats_mu_);
  PrefetchStats total;
  for (const PrefetchStats& s : prefetch_stats_) total += s;
  width_->update_from_totals(total, window_misses_, behind_);
  window_misses_ = 0;
}

std::vector<LayerStats> DeviceExpertStore::stats() const {
  std::lock_guard lk(stats_mu_);
  std::vector<LayerStats> r;
  for (size_t i = 0; i < pools_.size(); ++i)
    r.push_back({host_.index().layers[i].name, pools_[i]->capacity(), pools_[i]->resident(), host_.index().layers[i].stride,
                 pools_[i]->stats(), prefetch_stats_[i], pools_[i]->published(), placed_[i]});
  return r;
}

size_t DeviceExpertStore::resident_bytes() const {
  size_t b = 0;
  for (const auto& s : slots_) b += s.bytes();
  return b;
}

}  // namespace ms
