#pragma once
// The experts of an engine directory, streamed: each MoE layer has a resident pool; a routed
// expert that is not resident is read from its blob into a slot (all misses of a layer in one
// batch, in the background while the experts already resident compute), checked, and only then
// published. With prefetch, experts predicted for a later layer are read ahead into staging and
// promoted into the pool only when routing asks for them (experts/prefetch.h).
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "experts/expert_files.h"
#include "experts/placement.h"
#include "experts/pool.h"
#include "experts/prefetch.h"
#include "experts/usage.h"

namespace ms {

struct StoreOptions {
  int slots = 0;                       // per layer; 0 = every expert
  std::map<int, int> layer_caps;       // per model layer (pool profile); overrides `slots`
  std::map<int, std::vector<int>> pins;  // per model layer: experts loaded at start, never evicted
  PolicyKind policy = PolicyKind::LRU;
  IoKind io = IoKind::Auto;
  bool direct_io = true;               // O_DIRECT: bypass the page cache
  bool verify = true;                  // checksum every record read (--no-verify: off)
  int top_k = 1;                       // one token's experts: slots that pins must leave free
  bool cache = true;                   // false: the slots are staging and forget an expert at release
  PrefetchOptions prefetch;            // Auto resolves against the pools (prefetching())
  // Fault the slots' memory in at start: where a budget (--memory, --host-cache) sized the
  // pools. Unsized pools (every expert by default) may exceed the machine and fill only partly.
  bool prefault = false;
  // The VRAM pools' copy link paced to this many bytes a second (--h2d-rate, a benchmark's
  // stand-in for a slower PCIe link); 0: as fast as it goes.
  double h2d_rate = 0;
};

struct LayerStats {
  std::string name;
  int capacity = 0, resident = 0;
  size_t slot_bytes = 0;
  PoolStats pool;
  PrefetchStats prefetch;
  std::vector<uint8_t> present;  // [n_experts]: 1 where the expert is in the pool now
  PlacementStats placed;         // the VRAM pools' layers under the hybrid decode; zero elsewhere
};

class ExpertStore;

// What model/predict.h drives: a store of expert pools that reads the experts a later layer's
// router is predicted to ask for ahead of it (ExpertStore from disk into host staging; the CUDA
// backend's VRAM pools from the host tier into VRAM staging).
class ExpertPrefetcher {
 public:
  virtual ~ExpertPrefetcher() = default;
  virtual const EngineIndex& index() const = 0;
  // Expert layers whose experts are predicted from the residual stream after model layer `source`.
  virtual const std::vector<int>& prefetch_targets(int source) const = 0;
  virtual int prefetch_width() const = 0;  // experts a prediction names per token
  // Reads ahead the first experts named (best first, at most the width for each of `tokens`
  // tokens) that are not resident yet, in the background.
  virtual void prefetch(int layer, const std::vector<int>& experts, int tokens) = 0;
};

// Which expert layers each model layer's output predicts under `p` (layer L from L − a), and how
// many expert layers have a source at all (a window of the width's adaptation).
struct PrefetchSchedule {
  std::vector<std::vector<int>> targets;  // [model layer]: expert layers
  size_t n_targets = 0;
  // The expert layers predicted from model layer `source` (none for a source out of range).
  const std::vector<int>& targets_of(int source) const;
};
PrefetchSchedule prefetch_schedule(const EngineIndex& index, const PrefetchOptions& p);

// The experts of one ExpertStore::start_acquire: each one's record in its pool slot, usable once
// next() has returned its index. Hits come first, then misses in the order their reads complete.
class Acquired {
 public:
  Acquired(Acquired&&) = default;
  ~Acquired();  // an early end (an exception) waits for the reads in flight and frees their slots

  std::vector<const uint8_t*> records;  // [i]: expert i's record (valid once next() gave i)
  // The index of an expert that is ready and not returned before, waiting for a read if none
  // is; -1 once every one was returned. A failed read throws its error naming the file, layer
  // and expert, after the layer's pool was put back as it was.
  int next();
  // next(), then every other expert ready by now without waiting: the experts a caller can run
  // together. Empty once every one was returned.
  std::vector<int> next_batch();

 private:
  friend class ExpertStore;
  struct Pending {
    int index, expert, slot;
    std::unique_ptr<AsyncRead> demand;  // or:
    Staging::Entry* staged = nullptr;
    bool done() const { return demand ? demand->done() : staged->read.done(); }
  };
  Acquired(ExpertStore* store, int layer) : store_(store), layer_(layer) {}
  void promote(ExpertPool& pool, Pending& p, const ExpertLayer& l);
  void free_staged(Staging::Entry* e);
  bool any_ready() const;  // next() would not wait
  void wait_all();  // until every pending read has landed
  void abandon_all();

  ExpertStore* store_;
  int layer_;
  std::vector<int> ready_;  // indices ready now (hits), the next one last
  std::vector<Pending> pending_;
  int demand_reads_ = 0;  // not yet returned
  std::chrono::steady_clock::time_point submitted_;
};

class ExpertStore final : public ExpertPrefetcher {
 public:
  ExpertStore(const std::string& dir, const EngineIndex& index, const StoreOptions& opt);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  const EngineIndex& index() const override { return files_.index(); }
  int layer_of(const std::string& name) const;  // index into index().layers; throws if absent
  int capacity(int layer) const { return pools_[size_t(layer)]->capacity(); }
  // Slots not pinned: the most distinct unpinned experts one acquire() can take.
  int free_capacity(int layer) const { return pools_[size_t(layer)]->capacity() - pools_[size_t(layer)]->pinned(); }

  // Makes `experts` (distinct, at most free_capacity(layer)) resident: hits now, staged experts
  // promoted, the rest read in one batch ahead of every prefetch read. They stay resident until
  // release(layer).
  Acquired start_acquire(int layer, const std::vector<int>& experts);
  // start_acquire, waiting for all: their records. A failed read or checksum throws naming the
  // layer, expert and file; the pool stays consistent.
  std::vector<const uint8_t*> acquire(int layer, const std::vector<int>& experts);
  void release(int layer);
  // The record of `expert` where it is resident in its pool now, else null: no read, no use
  // counted. Valid until this store's next acquire or prefetch.
  const uint8_t* resident_record(int layer, int expert) const;
  // Reads `experts` of `layer` now and keeps them resident for good.
  void pin(int layer, const std::vector<int>& experts);

  // Whether every pool holds every expert of its layer.
  bool holds_everything() const;
  // Reads every expert of every layer into its pool (holds_everything() must be true), layer by
  // layer, each layer's reads issued together; `progress` (may be empty) gets each layer's
  // record bytes once they are in.
  void load_all(const std::function<void(size_t bytes)>& progress = {});

  // The routed ids of a forward of `layer` (T·top_k of them): counted per expert for the usage
  // history (usage()), and the pool hits of the first forwards, up to the one that reaches
  // kEarlyTokens tokens (prompt included), kept apart (early()).
  void count_routes(int layer, const int* ids, int n);
  UsageHistory usage() const;  // the routings counted since start, as one run
  static constexpr int kEarlyTokens = 64;
  struct Early {
    int tokens = 0;  // tokens of the forwards counted: kEarlyTokens or more once they are all in
    PoolStats pool;  // their pool hits and misses, summed over layers
  };
  Early early() const;
  PoolStats pool_totals() const;  // every pool's stats, summed

  // Prefetch (options().prefetch). Whether it runs: On, or Auto where some pool streams.
  bool prefetching() const { return staging_ != nullptr; }
  // Expert layers whose experts are predicted from the residual stream after model layer `source`.
  const std::vector<int>& prefetch_targets(int source) const override;
  int prefetch_width() const override;
  // Reads the first experts named (best first, at most the width for each of `tokens` tokens)
  // that are neither resident nor staged into staging, in the background, behind every demand
  // read. Adapts the width once every prefetch target has had a prediction.
  void prefetch(int layer, const std::vector<int>& experts, int tokens) override;
  void prefetch(int layer, const std::vector<int>& experts) { prefetch(layer, experts, 1); }

  std::vector<LayerStats> stats() const;
  void reset_stats();
  size_t resident_bytes() const;  // the slots' memory
  uint64_t registered_bytes() const { return files_.engine().registered_bytes(); }  // IoEngine::register_memory
  size_t staging_bytes() const { return staging_ ? staging_->bytes() : 0; }
  // Where staging lies (staging_bytes()): a promotion may make part of it a pool slot's memory.
  uint8_t* staging_memory() const { return staging_ ? staging_->memory() : nullptr; }
  int staging_buffers() const { return staging_ ? staging_->buffers() : 0; }
  double mean_prefetch_width() const;
  IoCounters io_counters() const { return files_.engine().counters(); }
  // Where the slots of `layer` were made (capacity x stride bytes): to register them with a
  // GPU, beside staging_memory().
  uint8_t* slot_memory(int layer) const { return pools_[size_t(layer)]->memory(); }
  const char* io_name() const { return files_.io_name(); }
  // The engine and its registered memory, for --stats: "io_uring, 17 MiB registered".
  std::string io_description() const;
  bool caches() const { return opt_.cache; }

 private:
  friend class Acquired;
  void setup_prefetch();
  void register_memory();
  void adapt_width_locked();

  ExpertFiles files_;
  StoreOptions opt_;
  std::vector<std::unique_ptr<ExpertPool>> pools_;
  // Prefetch: null staging_ = off.
  std::unique_ptr<Staging> staging_;
  mutable std::mutex prefetch_mu_;  // staging_, the counters below, the width
  PrefetchSchedule schedule_;
  std::vector<PrefetchStats> prefetch_stats_;  // [expert layer]
  std::unique_ptr<WidthController> width_;
  size_t predictions_ = 0;  // since the last adaptation
  uint64_t window_misses_ = 0;  // demand reads since the width's last adaptation
  mutable std::mutex usage_mu_;  // routed_, early_
  std::vector<std::vector<uint64_t>> routed_;  // [expert layer][expert]
  Early early_;
  bool early_done_ = false;  // early_.pool final: a forward after the first kEarlyTokens began
};

// The model layer a MoE block belongs to ("model.layers.12.mlp" -> 12), or -1 (MTP).
int model_layer_of(const std::string& name);

// The slots `opt` gives an expert layer: its cap in the pool profile, else opt.slots, else all.
int layer_capacity(const StoreOptions& opt, const ExpertLayer& layer);

}  // namespace ms
