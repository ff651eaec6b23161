#pragma once
// The resident pool of one MoE layer: a fixed number of slots at fixed addresses, an
// expert -> slot table, and a policy that picks victims. A slot is published in the table only
// after the read that fills it has completed; slots held by the forward in progress and pinned
// slots are never evicted (docs/ARCHITECTURE.md, invariants 2 and 3). Thread-safe.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "experts/policy.h"
#include "util/memory.h"

namespace ms {

struct PoolStats {
  uint64_t hits = 0, misses = 0, evictions = 0, bytes_read = 0;
  double read_s = 0, stall_s = 0;  // time reads were in flight; time compute waited on them
  PoolStats& operator+=(const PoolStats& o);
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

class ExpertPool {
 public:
  // slot_bytes 0: no memory behind the slots (trace simulation, or memory kept elsewhere).
  // keep false: staging, not a cache: release() forgets the experts of the slots it frees.
  // prefault: the slots' memory is faulted in now (a pool a budget sized), else on first use.
  ExpertPool(int n_experts, int capacity, size_t slot_bytes, PolicyKind policy, bool keep = true, bool prefault = true);
  ~ExpertPool();
  ExpertPool(const ExpertPool&) = delete;
  ExpertPool& operator=(const ExpertPool&) = delete;

  int capacity() const { return capacity_; }
  int n_experts() const { return n_experts_; }
  size_t slot_bytes() const { return slot_bytes_; }
  uint8_t* slot_data(int slot) const { return slot_memory_[size_t(slot)]; }
  uint8_t* memory() const { return memory_.data(); }  // the capacity x slot_bytes made at start
  // Gives a slot being filled (a miss acquire() returned, not yet published) `buffer` as its
  // memory (slot_bytes, 4 KiB aligned, holding the expert's record already) and returns the
  // memory the slot had, for the caller to keep: a staged record is promoted without a copy.
  uint8_t* exchange_memory(int slot, uint8_t* buffer);

  struct Miss {
    int expert, slot;
  };
  // Makes room for `experts` (distinct, at most capacity() of them, plus whatever is held
  // already): returns each one's slot and appends to `misses` the ones that must be read
  // before use. Every returned slot stays held until release(). Counts hits and misses.
  std::vector<int> acquire(const std::vector<int>& experts, std::vector<Miss>* misses);
  // The read of `expert` into `slot` completed: the slot may now be found by lookups.
  void publish(int expert, int slot);
  // The read of `expert` into `slot` failed: the slot goes back empty.
  void abandon(int expert, int slot);
  // Ends the use of every held slot (pinned ones stay held).
  void release();
  // Keeps `expert` resident for good once it is (acquire it, publish it, then pin it).
  void pin(int expert);
  int pinned() const;
  // The published slot of `expert`, or -1.
  int slot_of(int expert) const;
  int held() const;
  int resident() const;  // published experts
  std::vector<uint8_t> published() const;  // [n_experts]: 1 where the expert is published

  void add_io(uint64_t bytes, double read_s, double stall_s);
  PoolStats stats() const;
  void reset_stats();

 private:
  int pick_slot_locked(uint64_t now);
  int held_locked() const;

  const int n_experts_, capacity_;
  const size_t slot_bytes_;
  const bool keep_;
  ResidentMemory memory_;
  std::vector<uint8_t*> slot_memory_;  // slot -> its bytes: in memory_, or a buffer exchanged in
  std::unique_ptr<EvictionPolicy> policy_;
  mutable std::mutex mu_;
  std::vector<int> slot_of_;        // expert -> published slot or -1
  std::vector<int> expert_in_;      // slot -> expert it holds or is being filled with, or -1
  std::vector<uint8_t> held_;       // slot -> held by the forward in progress
  std::vector<uint8_t> pinned_;     // slot -> never evicted
  uint64_t clock_ = 0;
  PoolStats stats_;
};

}  // namespace ms
