#pragma once
// Eviction policies of the resident expert pool. A policy scores slots; the pool evicts the
// evictable slot with the lowest score. Time is the pool's access counter.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ms {

enum class PolicyKind { LRU, LFU, LRFU };

PolicyKind parse_policy(const std::string& name);  // "lru" | "lfu" | "lrfu"; throws naming it
const char* policy_name(PolicyKind k);

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // A slot received a new expert (its history starts over).
  virtual void on_fill(int slot, uint64_t now) = 0;
  // The expert in a slot was routed to (hit, or the use right after its fill).
  virtual void on_access(int slot, uint64_t now) = 0;
  // Lower is evicted first.
  virtual double score(int slot, uint64_t now) const = 0;
};

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, int slots);

}  // namespace ms
