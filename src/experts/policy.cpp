#include "experts/policy.h"

#include <cmath>

#include "util/error.h"

namespace ms {

PolicyKind parse_policy(const std::string& name) {
  if (name == "lru") return PolicyKind::LRU;
  if (name == "lfu") return PolicyKind::LFU;
  if (name == "lrfu") return PolicyKind::LRFU;
  fail("unknown eviction policy '{}' (expected lru, lfu or lrfu)", name);
}

const char* policy_name(PolicyKind k) { return k == PolicyKind::LRU ? "lru" : k == PolicyKind::LFU ? "lfu" : "lrfu"; }

namespace {

class Lru final : public EvictionPolicy {
 public:
  explicit Lru(int slots) : last_(size_t(slots), 0) {}
  void on_fill(int slot, uint64_t now) override { last_[size_t(slot)] = now; }
  void on_access(int slot, uint64_t now) override { last_[size_t(slot)] = now; }
  double score(int slot, uint64_t) const override { return double(last_[size_t(slot)]); }

 private:
  std::vector<uint64_t> last_;
};

// Frequency with periodic decay: every kHalfLife accesses all counts halve, so experts that
// were hot long ago fade. Recency breaks ties (a tiny fraction of the score).
class Lfu final : public EvictionPolicy {
 public:
  explicit Lfu(int slots) : count_(size_t(slots), 0.0), last_(size_t(slots), 0) {}
  void on_fill(int slot, uint64_t now) override {
    decay(now);
    count_[size_t(slot)] = 0.0;
    last_[size_t(slot)] = now;
  }
  void on_access(int slot, uint64_t now) override {
    decay(now);
    count_[size_t(slot)] += 1.0;
    last_[size_t(slot)] = now;
  }
  double score(int slot, uint64_t now) const override {
    return count_[size_t(slot)] + 1e-9 * double(last_[size_t(slot)]) / double(now + 1);
  }

 private:
  static constexpr uint64_t kHalfLife = 4096;
  void decay(uint64_t now) {
    while (now >= next_decay_) {
      for (auto& c : count_) c *= 0.5;
      next_decay_ += kHalfLife;
    }
  }
  std::vector<double> count_;
  std::vector<uint64_t> last_;
  uint64_t next_decay_ = kHalfLife;
};

// LRFU (Lee et al.): combined recency-frequency value, the sum over past accesses of
// 2^(-lambda * age). lambda -> 0 behaves like LFU, large lambda like LRU.
class Lrfu final : public EvictionPolicy {
 public:
  explicit Lrfu(int slots) : crf_(size_t(slots), 0.0), last_(size_t(slots), 0) {}
  void on_fill(int slot, uint64_t now) override {
    crf_[size_t(slot)] = 0.0;
    last_[size_t(slot)] = now;
  }
  void on_access(int slot, uint64_t now) override {
    crf_[size_t(slot)] = value(slot, now) + 1.0;
    last_[size_t(slot)] = now;
  }
  double score(int slot, uint64_t now) const override { return value(slot, now); }

 private:
  static constexpr double kLambda = 1.0 / 512;  // per access of the layer
  double value(int slot, uint64_t now) const {
    return crf_[size_t(slot)] * std::exp2(-kLambda * double(now - last_[size_t(slot)]));
  }
  std::vector<double> crf_;
  std::vector<uint64_t> last_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, int slots) {
  switch (kind) {
    case PolicyKind::LRU: return std::make_unique<Lru>(slots);
    case PolicyKind::LFU: return std::make_unique<Lfu>(slots);
    case PolicyKind::LRFU: return std::make_unique<Lrfu>(slots);
  }
  fail("unknown eviction policy");
}

}  // namespace ms
