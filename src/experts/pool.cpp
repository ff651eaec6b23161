#include "experts/pool.h"

#include <cstdlib>
#include <limits>
#include <utility>

#include "util/error.h"

namespace ms {

PoolStats& PoolStats::operator+=(const PoolStats& o) {
  hits += o.hits;
  misses += o.misses;
  evictions += o.evictions;
  bytes_read += o.bytes_read;
  read_s += o.read_s;
  stall_s += o.stall_s;
  return *this;
}

ExpertPool::ExpertPool(int n_experts, int capacity, size_t slot_bytes, PolicyKind policy, bool keep, bool prefault)
    : n_experts_(n_experts),
      capacity_(capacity),
      slot_bytes_(slot_bytes),
      keep_(keep),
      policy_(make_policy(policy, capacity)),
      slot_of_(size_t(n_experts), -1),
      expert_in_(size_t(capacity), -1),
      held_(size_t(capacity), 0),
      pinned_(size_t(capacity), 0) {
  if (capacity <= 0) fail("an expert pool needs at least one slot, got {}", capacity);
  // 4 KiB-aligned slots: O_DIRECT reads land in them directly; faulted in now where a budget
  // sized them, so that no decode pays for first-touch page faults.
  if (slot_bytes > 0) memory_ = ResidentMemory(size_t(capacity) * slot_bytes, "an expert pool", prefault);
  for (int s = 0; s < capacity; ++s) slot_memory_.push_back(memory_.data() + size_t(s) * slot_bytes);
}

uint8_t* ExpertPool::exchange_memory(int slot, uint8_t* buffer) {
  std::lock_guard lk(mu_);
  if (!held_[size_t(slot)] || expert_in_[size_t(slot)] < 0 || slot_of_[size_t(expert_in_[size_t(slot)])] == slot)
    fail("slot {} is not being filled: its memory cannot be exchanged", slot);
  return std::exchange(slot_memory_[size_t(slot)], buffer);
}

ExpertPool::~ExpertPool() = default;

int ExpertPool::pick_slot_locked(uint64_t now) {
  int best = -1;
  double best_score = std::numeric_limits<double>::infinity();
  for (int s = 0; s < capacity_; ++s) {
    if (held_[size_t(s)]) continue;
    if (expert_in_[size_t(s)] < 0) return s;  // free
    const double sc = policy_->score(s, now);
    if (sc < best_score) best = s, best_score = sc;
  }
  return best;
}

std::vector<int> ExpertPool::acquire(const std::vector<int>& experts, std::vector<Miss>* misses) {
  std::lock_guard lk(mu_);
  std::vector<int> slots(experts.size(), -1);
  // Hold the hits first, so that a miss never evicts an expert this same batch asks for; then
  // account every expert in the order given (the order routing ranked them).
  for (size_t i = 0; i < experts.size(); ++i) {
    const int e = experts[i];
    if (e < 0 || e >= n_experts_) fail("expert id {} out of range [0, {})", e, n_experts_);
    for (size_t j = 0; j < i; ++j)
      if (experts[j] == e) fail("expert {} requested twice in one batch", e);
    if ((slots[i] = slot_of_[size_t(e)]) >= 0) held_[size_t(slots[i])] = 1;
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    const int e = experts[i];
    if (slots[i] >= 0) {
      policy_->on_access(slots[i], ++clock_);
      ++stats_.hits;
      continue;
    }
    const int s = pick_slot_locked(clock_ + 1);
    if (s < 0) fail("expert pool of {} slots cannot hold {} experts at once", capacity_, held_locked() + 1);
    if (const int old = expert_in_[size_t(s)]; old >= 0) {
      slot_of_[size_t(old)] = -1;
      ++stats_.evictions;
    }
    expert_in_[size_t(s)] = e;
    held_[size_t(s)] = 1;
    policy_->on_fill(s, ++clock_);
    policy_->on_access(s, clock_);
    ++stats_.misses;
    slots[i] = s;
    if (misses) misses->push_back({e, s});
  }
  return slots;
}

void ExpertPool::publish(int expert, int slot) {
  std::lock_guard lk(mu_);
  if (expert_in_[size_t(slot)] != expert) fail("slot {} is not being filled with expert {}", slot, expert);
  slot_of_[size_t(expert)] = slot;
}

void ExpertPool::abandon(int expert, int slot) {
  std::lock_guard lk(mu_);
  if (expert_in_[size_t(slot)] == expert) expert_in_[size_t(slot)] = -1;
  if (slot_of_[size_t(expert)] == slot) slot_of_[size_t(expert)] = -1;
}

void ExpertPool::release() {
  std::lock_guard lk(mu_);
  if (!keep_)
    for (size_t s = 0; s < held_.size(); ++s)
      if (held_[s] && !pinned_[s] && expert_in_[s] >= 0) {
        slot_of_[size_t(expert_in_[s])] = -1;
        expert_in_[s] = -1;
      }
  held_ = pinned_;
}

void ExpertPool::pin(int expert) {
  std::lock_guard lk(mu_);
  const int s = expert >= 0 && expert < n_experts_ ? slot_of_[size_t(expert)] : -1;
  if (s < 0) fail("cannot pin expert {}: it is not resident", expert);
  pinned_[size_t(s)] = held_[size_t(s)] = 1;
}

int ExpertPool::pinned() const {
  std::lock_guard lk(mu_);
  int n = 0;
  for (auto p : pinned_) n += p;
  return n;
}

std::vector<uint8_t> ExpertPool::published() const {
  std::lock_guard lk(mu_);
  std::vector<uint8_t> p(slot_of_.size());
  for (size_t e = 0; e < p.size(); ++e) p[e] = slot_of_[e] >= 0;
  return p;
}

int ExpertPool::slot_of(int expert) const {
  std::lock_guard lk(mu_);
  return slot_of_[size_t(expert)];
}

int ExpertPool::held() const {
  std::lock_guard lk(mu_);
  return held_locked();
}

int ExpertPool::held_locked() const {
  int n = 0;
  for (auto h : held_) n += h;
  return n;
}

int ExpertPool::resident() const {
  std::lock_guard lk(mu_);
  int n = 0;
  for (int s : slot_of_) n += s >= 0;
  return n;
}

void ExpertPool::add_io(uint64_t bytes, double read_s, double stall_s) {
  std::lock_guard lk(mu_);
  stats_.bytes_read += bytes;
  stats_.read_s += read_s;
  stats_.stall_s += stall_s;
}

void ExpertPool::reset_stats() {
  std::lock_guard lk(mu_);
  stats_ = {};
}

PoolStats ExpertPool::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace ms
