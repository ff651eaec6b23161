#include "experts/expert_store.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "util/error.h"

namespace ms {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

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
  for (const ExpertLayer& l : index.layers) {
    pools_.push_back(
        std::make_unique<ExpertPool>(l.n_experts, layer_capacity(opt, l), l.stride, opt.policy, opt.cache, opt.prefault));
    routed_.emplace_back(size_t(l.n_experts), 0);
  }
  setup_prefetch();
  if (opt.prefault) register_memory();  // before any read (IoEngine::register_memory)
  for (const auto& [layer, experts] : opt.pins)
    for (size_t i = 0; i < index.layers.size(); ++i)
      if (model_layer_of(index.layers[i].name) == layer) pin(int(i), experts);
}

// Pools a budget sized are faulted in at start anyway: registering them and the staging (so
// that io_uring pins their pages once, not on every read) costs no memory they would not take.
void ExpertStore::register_memory() {
  std::vector<MemoryRegion> regions;
  for (const auto& p : pools_)
    if (p->memory()) regions.push_back({p->memory(), size_t(p->capacity()) * p->slot_bytes()});
  if (staging_) regions.push_back({staging_->memory(), staging_->bytes()});
  files_.engine().register_memory(regions);
}

ExpertStore::~ExpertStore() {
  if (!staging_) return;
  // Prefetch reads may still be landing in staging: they finish before its memory goes.
  files_.engine().wait_until([&] {
    for (const auto& e : staging_->entries())
      if (!e->read.done()) return false;
    return true;
  });
}

const std::vector<int>& PrefetchSchedule::targets_of(int source) const {
  static const std::vector<int> none;
  return source >= 0 && size_t(source) < targets.size() ? targets[size_t(source)] : none;
}

PrefetchSchedule prefetch_schedule(const EngineIndex& index, const PrefetchOptions& p) {
  PrefetchSchedule s;
  for (size_t i = 0; i < index.layers.size(); ++i) {
    const int layer = model_layer_of(index.layers[i].name);
    const int source = layer - p.ahead_of(layer);
    if (layer < 0 || source < 0) continue;  // the MTP head's, or a layer with none before it
    if (size_t(source) >= s.targets.size()) s.targets.resize(size_t(source) + 1);
    s.targets[size_t(source)].push_back(int(i));
    ++s.n_targets;
  }
  return s;
}

void ExpertStore::setup_prefetch() {
  const PrefetchOptions& p = opt_.prefetch;
  prefetch_stats_.assign(pools_.size(), {});
  bool streams = false;
  for (size_t i = 0; i < pools_.size(); ++i) streams |= pools_[i]->capacity() < pools_[i]->n_experts();
  const bool on = p.mode == PrefetchMode::On || (p.mode == PrefetchMode::Auto && streams && opt_.cache);
  if (!on || pools_.empty()) return;
  staging_ = std::make_unique<Staging>(ms::staging_buffers(p, opt_.top_k), index().widest_stride());
  schedule_ = prefetch_schedule(index(), p);
  width_ = make_width_controller(p, opt_.top_k);
}

int ExpertStore::layer_of(const std::string& name) const {
  for (size_t i = 0; i < index().layers.size(); ++i)
    if (index().layers[i].name == name) return int(i);
  fail("{}: no expert layer '{}' in {}", files_.dir(), name, kEngineIndexFile);
}

Acquired ExpertStore::start_acquire(int layer, const std::vector<int>& experts) {
  ExpertPool& pool = *pools_[size_t(layer)];
  std::vector<ExpertPool::Miss> misses;
  const std::vector<int> slots = pool.acquire(experts, &misses);
  Acquired a(this, layer);
  std::vector<char> missed(experts.size(), 0);
  for (size_t i = 0; i < experts.size(); ++i) a.records.push_back(pool.slot_data(slots[i]));
  std::vector<AsyncRead*> demand;
  {
    std::unique_lock lk(prefetch_mu_, std::defer_lock);
    if (staging_) lk.lock();
    for (const ExpertPool::Miss& m : misses) {
      const int i = int(std::find(experts.begin(), experts.end(), m.expert) - experts.begin());
      missed[size_t(i)] = 1;
      Staging::Entry* s = staging_ ? staging_->find(layer, m.expert) : nullptr;
      if (s && !s->claimed) {  // predicted: promoted from staging, no read of its own
        s->claimed = true;
        files_.engine().expedite(&s->read);  // still queued behind other predictions: needed now
        ++prefetch_stats_[size_t(layer)].used;
        a.pending_.push_back({i, m.expert, m.slot, nullptr, s});
        continue;
      }
      auto r = std::make_unique<AsyncRead>();
      r->op = files_.read_op(layer, m.expert, pool.slot_data(m.slot));
      demand.push_back(r.get());
      a.pending_.push_back({i, m.expert, m.slot, std::move(r), nullptr});
      if (staging_) ++window_misses_;  // the width's window (under prefetch_mu_)
    }
  }
  for (size_t i = 0; i < experts.size(); ++i)
    if (!missed[i]) a.ready_.push_back(int(i));
  std::reverse(a.ready_.begin(), a.ready_.end());  // next() takes from the back: routing's order
  a.demand_reads_ = int(demand.size());
  a.submitted_ = std::chrono::steady_clock::now();
  files_.engine().submit(demand.data(), demand.size());
  return a;
}

bool Acquired::any_ready() const {
  if (!ready_.empty()) return true;
  for (const Pending& p : pending_)
    if (p.done()) return true;
  return false;
}

std::vector<int> Acquired::next_batch() {
  std::vector<int> out;
  for (int i; (out.empty() || any_ready()) && (i = next()) >= 0;) out.push_back(i);
  return out;
}

int Acquired::next() {
  if (!ready_.empty()) {
    const int i = ready_.back();
    ready_.pop_back();
    return i;
  }
  if (pending_.empty()) return -1;
  ExpertPool& pool = *store_->pools_[size_t(layer_)];
  auto find_done = [&] {
    for (size_t k = 0; k < pending_.size(); ++k)
      if (pending_[k].done()) return int(k);
    return -1;
  };
  int k = find_done();
  if (k < 0) {  // the compute waits for a read: stall
    const auto start = std::chrono::steady_clock::now();
    store_->files_.engine().wait_until([&] { return find_done() >= 0; });
    pool.add_io(0, 0, seconds_since(start));
    k = find_done();
  }
  Pending p = std::move(pending_[size_t(k)]);
  pending_.erase(pending_.begin() + k);
  const ExpertLayer& l = store_->index().layers[size_t(layer_)];
  try {
    if (p.staged) {
      store_->files_.check(layer_, p.expert, p.staged->read.op);
      promote(pool, p, l);
    } else {
      store_->files_.check(layer_, p.expert, p.demand->op);
      const bool last = --demand_reads_ == 0;
      pool.add_io(uint64_t(p.demand->op.result), last ? seconds_since(submitted_) : 0.0, 0);
    }
  } catch (...) {
    free_staged(p.staged);  // a bad record never reaches the pool
    pool.abandon(p.expert, p.slot);
    abandon_all();
    pool.release();
    throw;
  }
  free_staged(p.staged);
  pool.publish(p.expert, p.slot);
  return p.index;
}

void Acquired::free_staged(Staging::Entry* e) {
  if (!e) return;
  std::lock_guard lk(store_->prefetch_mu_);
  store_->staging_->free(e);
}

void Acquired::wait_all() {
  store_->files_.engine().wait_until([&] {
    for (const Pending& p : pending_)
      if (!p.done()) return false;
    return true;
  });
}

// A staged record into its pool slot: the staging buffer becomes the slot's memory and the
// slot's old memory the buffer (no copy), where both are of one size; else a copy.
void Acquired::promote(ExpertPool& pool, Pending& p, const ExpertLayer& l) {
  std::lock_guard lk(store_->prefetch_mu_);
  if (store_->staging_->buffer_bytes() == l.stride) {
    p.staged->data = pool.exchange_memory(p.slot, p.staged->data);
    records[size_t(p.index)] = pool.slot_data(p.slot);
  } else {
    std::memcpy(pool.slot_data(p.slot), p.staged->data, l.record_bytes);
  }
}

void Acquired::abandon_all() {
  wait_all();  // reads in flight write into slots (or staging): they land before the slots go back
  ExpertPool& pool = *store_->pools_[size_t(layer_)];
  for (Pending& p : pending_) {
    pool.abandon(p.expert, p.slot);
    if (p.staged) {
      std::lock_guard lk(store_->prefetch_mu_);
      p.staged->claimed = false;  // still a good prediction for a later acquire
    }
  }
  pending_.clear();
  ready_.clear();
}

Acquired::~Acquired() {
  if (pending_.empty()) return;
  abandon_all();
  store_->pools_[size_t(layer_)]->release();
}

std::vector<const uint8_t*> ExpertStore::acquire(int layer, const std::vector<int>& experts) {
  Acquired a = start_acquire(layer, experts);
  a.wait_all();  // every read landed first: a failure is then the first failed one in the order asked
  while (a.next() >= 0) {
  }
  return a.records;
}

void ExpertStore::release(int layer) { pools_[size_t(layer)]->release(); }

const uint8_t* ExpertStore::resident_record(int layer, int expert) const {
  const ExpertPool& pool = *pools_[size_t(layer)];
  const int slot = pool.slot_of(expert);
  return slot >= 0 ? pool.slot_data(slot) : nullptr;
}

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

bool ExpertStore::holds_everything() const {
  for (size_t l = 0; l < pools_.size(); ++l)
    if (pools_[l]->capacity() < index().layers[l].n_experts) return false;
  return true;
}

void ExpertStore::load_all(const std::function<void(size_t)>& progress) {
  if (!holds_everything()) fail("{}: the pools cannot hold every expert, so they cannot all be loaded", files_.dir());
  for (size_t l = 0; l < pools_.size(); ++l) {
    const ExpertLayer& layer = index().layers[l];
    std::vector<int> all(size_t(layer.n_experts));
    std::iota(all.begin(), all.end(), 0);
    acquire(int(l), all);  // every read of the layer in flight at once
    release(int(l));
    if (progress) progress(size_t(layer.n_experts) * layer.record_bytes);
  }
}

void ExpertStore::count_routes(int layer, const int* ids, int n) {
  std::lock_guard lk(usage_mu_);
  std::vector<uint64_t>& c = routed_[size_t(layer)];
  for (int i = 0; i < n; ++i)
    if (ids[i] >= 0 && size_t(ids[i]) < c.size()) ++c[size_t(ids[i])];
  if (layer != 0 || early_done_) return;
  // Layer 0's routes start a forward: the forwards before it are complete, their pool hits in.
  if (early_.tokens >= kEarlyTokens) {
    early_.pool = pool_totals();
    early_done_ = true;
    return;
  }
  early_.tokens += n / std::max(1, opt_.top_k);
}

PoolStats ExpertStore::pool_totals() const {
  PoolStats total;
  for (const auto& p : pools_) total += p->stats();
  return total;
}

UsageHistory ExpertStore::usage() const {
  UsageHistory h = empty_usage(index());
  std::lock_guard lk(usage_mu_);
  for (size_t l = 0; l < routed_.size(); ++l)
    for (size_t e = 0; e < routed_[l].size(); ++e) h.counts[l][e] = double(routed_[l][e]);
  h.runs = 1;
  return h;
}

ExpertStore::Early ExpertStore::early() const {
  std::lock_guard lk(usage_mu_);
  Early e = early_;
  if (!early_done_) e.pool = pool_totals();  // every forward so far is one of the first ones
  return e;
}

const std::vector<int>& ExpertStore::prefetch_targets(int source) const { return schedule_.targets_of(source); }

int ExpertStore::prefetch_width() const {
  std::lock_guard lk(prefetch_mu_);
  return width_ ? width_->width() : 0;
}

double ExpertStore::mean_prefetch_width() const {
  std::lock_guard lk(prefetch_mu_);
  return width_ ? width_->mean() : 0.0;
}

void ExpertStore::prefetch(int layer, const std::vector<int>& experts, int tokens) {
  if (!staging_) return;
  ExpertPool& pool = *pools_[size_t(layer)];
  const ExpertLayer& l = index().layers[size_t(layer)];
  std::vector<AsyncRead*> reads;
  {
    std::lock_guard lk(prefetch_mu_);
    PrefetchStats& st = prefetch_stats_[size_t(layer)];
    const size_t w = std::min(experts.size(), size_t(width_->width()) * size_t(std::max(1, tokens)));
    for (size_t i = 0; i < w; ++i) {
      const int e = experts[i];
      ++st.predicted;
      if (pool.slot_of(e) >= 0 || staging_->find(layer, e)) continue;
      int dropped = -1;
      Staging::Entry* s = staging_->take(layer, e, &dropped);
      if (!s) {
        ++st.no_buffer;
        continue;
      }
      if (dropped >= 0) ++prefetch_stats_[size_t(dropped)].wasted;
      s->read.op = files_.read_op(layer, e, s->data);
      s->read.priority = ReadPriority::Prefetch;
      reads.push_back(&s->read);
      ++st.issued;
      st.bytes += l.stride;
    }
    if (++predictions_ >= schedule_.n_targets) adapt_width_locked();
  }
  files_.engine().submit(reads.data(), reads.size());
}

void ExpertStore::adapt_width_locked() {
  predictions_ = 0;
  PrefetchStats total;
  for (const PrefetchStats& s : prefetch_stats_) total += s;
  width_->update_from_totals(total, window_misses_, files_.engine().counters().demand_behind_prefetch);
  window_misses_ = 0;
}

std::vector<LayerStats> ExpertStore::stats() const {
  std::vector<LayerStats> r;
  std::lock_guard lk(prefetch_mu_);
  for (size_t i = 0; i < pools_.size(); ++i)
    r.push_back({index().layers[i].name, pools_[i]->capacity(), pools_[i]->resident(), pools_[i]->slot_bytes(),
                 pools_[i]->stats(), prefetch_stats_[i], pools_[i]->published()});
  return r;
}

void ExpertStore::reset_stats() {
  for (auto& p : pools_) p->reset_stats();
  std::lock_guard lk(prefetch_mu_);
  for (auto& s : prefetch_stats_) s = {};
  if (width_) width_->restart_window(files_.engine().counters().demand_behind_prefetch);
  window_misses_ = 0;
}

std::string ExpertStore::io_description() const {
  const uint64_t reg = registered_bytes();
  return reg ? fmt::format("{}, {} MiB registered", io_name(), reg >> 20) : std::string(io_name());
}

size_t ExpertStore::resident_bytes() const {
  size_t b = 0;
  for (auto& p : pools_) b += size_t(p->capacity()) * p->slot_bytes();
  return b;
}

}  // namespace ms
