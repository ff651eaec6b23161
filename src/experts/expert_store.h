#pragma once
// The experts of an engine model directory, streamed: each MoE layer has a resident pool; a
// routed expert that is not resident is read from its blob into a slot (all misses of a layer
// in one batch), optionally checksummed, and only then published.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "experts/expert_files.h"
#include "experts/pool.h"

namespace ms {

struct StoreOptions {
  int slots = 0;                       // per layer; 0 = every expert
  std::map<int, int> layer_caps;       // per model layer (pool profile); overrides `slots`
  std::map<int, std::vector<int>> pins;  // per model layer: experts loaded at start, never evicted
  PolicyKind policy = PolicyKind::LRU;
  IoKind io = IoKind::Auto;
  bool direct_io = true;               // O_DIRECT: bypass the page cache
  bool verify = false;                 // checksum every record read
  int top_k = 1;                       // one token's experts: slots that pins must leave free
  bool cache = true;                   // false: the slots are staging and forget an expert at release
};

struct LayerStats {
  std::string name;
  int capacity = 0, resident = 0;
  size_t slot_bytes = 0;
  PoolStats pool;
};

class ExpertStore {
 public:
  ExpertStore(const std::string& dir, const EngineIndex& index, const StoreOptions& opt);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  const EngineIndex& index() const { return files_.index(); }
  int layer_of(const std::string& name) const;  // index into index().layers; throws if absent
  int capacity(int layer) const { return pools_[size_t(layer)]->capacity(); }
  // Slots not pinned: the most distinct unpinned experts one acquire() can take.
  int free_capacity(int layer) const { return pools_[size_t(layer)]->capacity() - pools_[size_t(layer)]->pinned(); }

  // Makes `experts` (distinct, at most capacity(layer)) resident and returns their records.
  // They stay resident until release(layer). A failed read or checksum throws naming the
  // layer, expert and file; the pool stays consistent.
  std::vector<const uint8_t*> acquire(int layer, const std::vector<int>& experts);
  void release(int layer);
  // Reads `experts` of `layer` now and keeps them resident for good.
  void pin(int layer, const std::vector<int>& experts);

  std::vector<LayerStats> stats() const;
  void reset_stats();
  size_t resident_bytes() const;  // the slots' memory
  // Where the slots of `layer` live (capacity x stride bytes): to register them with a GPU.
  uint8_t* slot_memory(int layer) const { return pools_[size_t(layer)]->slot_data(0); }
  const char* io_name() const { return files_.io_name(); }
  bool caches() const { return opt_.cache; }

 private:
  ExpertFiles files_;
  StoreOptions opt_;
  std::vector<std::unique_ptr<ExpertPool>> pools_;
};

// The model layer a MoE block belongs to ("model.layers.12.mlp" -> 12), or -1 (MTP).
int model_layer_of(const std::string& name);

// The slots `opt` gives an expert layer: its cap in the pool profile, else opt.slots, else all.
int layer_capacity(const StoreOptions& opt, const ExpertLayer& layer);

}  // namespace ms
