#include "experts/pool.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "util/error.h"

namespace ms {
namespace {

TEST(ExpertPool, MissesAreReadThenPublishedHitsFindTheirSlot) {
  ExpertPool pool(16, 4, 4096, PolicyKind::LRU);
  std::vector<ExpertPool::Miss> misses;
  std::vector<int> slots = pool.acquire({3, 7}, &misses);
  ASSERT_EQ(misses.size(), 2u);
  EXPECT_EQ(pool.slot_of(3), -1) << "not published before its read completed";
  for (auto m : misses) pool.publish(m.expert, m.slot);
  pool.release();
  EXPECT_EQ(pool.slot_of(3), slots[0]);
  misses.clear();
  EXPECT_EQ(pool.acquire({7, 3}, &misses), (std::vector<int>{slots[1], slots[0]}));
  EXPECT_TRUE(misses.empty());
  EXPECT_EQ(pool.stats().hits, 2u);
  EXPECT_EQ(pool.stats().misses, 2u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.slot_data(1)) % 4096, 0u) << "slots are O_DIRECT-aligned";
}

TEST(ExpertPool, StagingForgetsWhatItReleasedButKeepsPins) {
  ExpertPool pool(16, 4, 0, PolicyKind::LRU, /*keep=*/false);
  std::vector<ExpertPool::Miss> misses;
  pool.acquire({3, 7}, &misses);
  for (auto m : misses) pool.publish(m.expert, m.slot);
  pool.pin(7);
  pool.release();
  EXPECT_EQ(pool.slot_of(3), -1);
  EXPECT_GE(pool.slot_of(7), 0);
  misses.clear();
  pool.acquire({3, 7}, &misses);
  ASSERT_EQ(misses.size(), 1u);
  EXPECT_EQ(misses[0].expert, 3);
  EXPECT_EQ(pool.stats().hits, 1u);
  EXPECT_EQ(pool.stats().evictions, 0u) << "a forgotten slot is free, not evicted";
}

TEST(ExpertPool, HeldSlotsAreNeverEvicted) {
  ExpertPool pool(32, 4, 0, PolicyKind::LRU);
  std::vector<ExpertPool::Miss> misses;
  for (int e : {0, 1, 2, 3}) {  // fill; 0 is least recent
    pool.acquire({e}, &misses);
    pool.publish(e, misses.back().slot);
    pool.release();
  }
  // 0 and 1 are held by this batch: the misses must evict 2 and 3, not them.
  misses.clear();
  pool.acquire({0, 1, 10, 11}, &misses);
  for (auto m : misses) pool.publish(m.expert, m.slot);
  EXPECT_GE(pool.slot_of(0), 0);
  EXPECT_GE(pool.slot_of(1), 0);
  EXPECT_EQ(pool.slot_of(2), -1);
  EXPECT_EQ(pool.slot_of(3), -1);
  // Nothing more fits while all four are held.
  EXPECT_THROW(pool.acquire({20}, &misses), Error);
  pool.release();
  std::set<int> slots;
  for (int e : {0, 1, 10, 11}) slots.insert(pool.slot_of(e));
  EXPECT_EQ(slots.size(), 4u);
}

TEST(ExpertPool, RejectsBadRequests) {
  ExpertPool pool(8, 2, 0, PolicyKind::LFU);
  EXPECT_THROW(pool.acquire({8}, nullptr), Error);
  EXPECT_THROW(pool.acquire({1, 1}, nullptr), Error);
  EXPECT_THROW(ExpertPool(8, 0, 0, PolicyKind::LRU), Error);
  EXPECT_THROW(parse_policy("fifo"), Error);
}

TEST(ExpertPool, LfuKeepsFrequentExpertsLruKeepsRecentOnes) {
  for (PolicyKind kind : {PolicyKind::LRU, PolicyKind::LFU}) {
    ExpertPool pool(8, 2, 0, kind);
    std::vector<ExpertPool::Miss> misses;
    auto use = [&](int e) {
      misses.clear();
      pool.acquire({e}, &misses);
      for (auto m : misses) pool.publish(m.expert, m.slot);
      pool.release();
    };
    for (int i = 0; i < 5; ++i) use(0);  // 0 is frequent
    use(1);                              // 1 is recent
    use(2);                              // evicts 0 under LRU, 1 under LFU
    EXPECT_EQ(pool.slot_of(0) >= 0, kind == PolicyKind::LFU) << policy_name(kind);
    EXPECT_EQ(pool.slot_of(1) >= 0, kind == PolicyKind::LRU) << policy_name(kind);
  }
}

}  // namespace
}  // namespace ms

namespace ms {
namespace {

TEST(ExpertPool, PinnedExpertsAreNeverEvicted) {
  ExpertPool pool(32, 3, 0, PolicyKind::LRU);
  std::vector<ExpertPool::Miss> misses;
  pool.acquire({5}, &misses);
  pool.publish(5, misses.back().slot);
  pool.pin(5);
  pool.release();
  for (int e = 10; e < 30; ++e) {  // churn through the two free slots
    misses.clear();
    pool.acquire({e, e + 1 < 30 ? e + 1 : 0}, &misses);
    for (auto m : misses) pool.publish(m.expert, m.slot);
    pool.release();
    ASSERT_GE(pool.slot_of(5), 0) << "pinned expert evicted at " << e;
  }
  EXPECT_EQ(pool.pinned(), 1);
  EXPECT_THROW(pool.pin(31), Error) << "an expert that is not resident cannot be pinned";
}

}  // namespace
}  // namespace ms
