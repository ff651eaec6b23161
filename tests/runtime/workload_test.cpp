// Benchmark workloads (runtime/workload.h): parsing, and the routing curve a workload's routes
// give a per-layer LRU pool.
#include "runtime/workload.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace ms {
namespace {

TEST(Workload, ParsesAListAndNamesWhatItRefuses) {
  const std::vector<WorkloadKind> w = parse_workloads("text,uniform,greedy");
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], WorkloadKind::Text);
  EXPECT_EQ(w[2], WorkloadKind::Greedy);
  test::expect_error([] { parse_workloads("uniform,zipf"); }, {"--workload", "'zipf'"});
  test::expect_error([] { parse_workloads(""); }, {"--workload"});
}

// One expert set repeated: every step after the first hits, at any pool of top_k or more, and
// every expert is reused. Disjoint sets cycling through all experts: nothing is reused, and
// only a pool that holds the whole cycle hits.
TEST(Workload, RoutingCurveOfRepeatedAndCyclingRoutes) {
  constexpr int kExperts = 64, kTopK = 4, kSteps = 40;
  std::vector<std::vector<std::vector<int>>> same, cycling;
  for (int s = 0; s < kSteps; ++s) {
    same.push_back({{1, 2, 3, 4}, {5, 6, 7, 8}});
    std::vector<int> set;
    for (int k = 0; k < kTopK; ++k) set.push_back((s * kTopK + k) % 32);  // a cycle of 8 steps over 32 experts
    cycling.push_back({set, set});
  }
  const RoutingCurve a = routing_curve(same, kExperts, kTopK);
  for (double h : a.hit) EXPECT_NEAR(h, double(kSteps - 1) / kSteps, 1e-9);
  EXPECT_DOUBLE_EQ(a.reuse, 1.0);
  const RoutingCurve b = routing_curve(cycling, kExperts, kTopK);
  EXPECT_DOUBLE_EQ(b.reuse, 0.0);
  EXPECT_DOUBLE_EQ(b.hit[0], 0.0);  // 4 slots
  EXPECT_DOUBLE_EQ(b.hit[2], 0.0);  // 16 slots: LRU evicts each expert before its next turn
  EXPECT_NEAR(b.hit[3], 1.0 - 32.0 / (kSteps * kTopK), 1e-9);  // 32 slots: only the first cycle misses
}

}  // namespace
}  // namespace ms
