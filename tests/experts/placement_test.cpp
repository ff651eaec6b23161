// The hybrid decode's placement of VRAM misses (experts/placement.h) with recorded rates: an
// 80B-A3B expert record (1.77 MB) over a PCIe 5 copy stream (54.8 GB/s measured on the H100 host)
// and a PCIe 4 card's (25 GB/s), the GPU's expert compute and a 16-thread CPU's.
#include "experts/placement.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "test_support.h"

namespace ms {
namespace {

constexpr size_t kRecord = 1'770'000;

PlacementRates pcie(double gb_s) {
  return {.h2d_bytes_per_s = gb_s * 1e9, .gpu_expert_s = 6e-6, .cpu_expert_s = 40e-6, .cpu_round_trip_s = 20e-6};
}

LayerMisses misses(int n, int resident = 0, double backlog_s = 0) {
  LayerMisses m{.resident = resident, .record_bytes = kRecord, .copy_backlog_s = backlog_s};
  m.experts.resize(size_t(n));
  std::iota(m.experts.begin(), m.experts.end(), 100);
  return m;
}

// The best split by brute force over every subset size: place_misses must reach it.
double best_time(const LayerMisses& m, const PlacementRates& r) {
  double best = std::numeric_limits<double>::infinity();
  for (int k = 0; k <= int(m.experts.size()); ++k) best = std::min(best, cost_of(m, r, k).expected_s());
  return best;
}

TEST(CpuExperts, ParsesAutoOffAndALayerCount) {
  EXPECT_EQ(parse_cpu_experts("auto").mode, CpuExperts::Mode::Auto);
  EXPECT_EQ(parse_cpu_experts("off").mode, CpuExperts::Mode::Off);
  EXPECT_EQ(parse_cpu_experts("0").mode, CpuExperts::Mode::Off);
  const CpuExperts c = parse_cpu_experts("12");
  EXPECT_EQ(c.mode, CpuExperts::Mode::Layers);
  EXPECT_TRUE(c.static_cpu(0));
  EXPECT_TRUE(c.static_cpu(11));
  EXPECT_FALSE(c.static_cpu(12));
  EXPECT_FALSE(parse_cpu_experts("auto").static_cpu(0));
  for (const char* bad : {"", "-1", "12x", "all", " 3"})
    test::expect_error([&] { parse_cpu_experts(bad); }, {"--cpu-experts", "'" + std::string(bad) + "'"});
}

TEST(Placement, WithoutACpuSideEveryMissIsCopied) {
  PlacementRates r = pcie(25);
  r.cpu_expert_s = 0;
  const Placement p = place_misses(misses(8), r);
  EXPECT_EQ(p.copy.size(), 8u);
  EXPECT_TRUE(p.cpu.empty());
  EXPECT_EQ(p.cpu_s, 0);
}

TEST(Placement, NoMissesCostTheResidentComputeOnly) {
  const Placement p = place_misses(misses(0, 10), pcie(25));
  EXPECT_TRUE(p.copy.empty() && p.cpu.empty());
  EXPECT_DOUBLE_EQ(p.gpu_s, 10 * 6e-6);
}

// A PCIe 4 card: a copy (71 µs) costs more than the CPU's compute (40 µs) of the same expert, so
// the CPU takes most misses; the slow side is balanced within one expert of the other.
TEST(Placement, ASlowCopyStreamSendsMostMissesToTheCpu) {
  const LayerMisses m = misses(8, 2);
  const PlacementRates r = pcie(25);
  const Placement p = place_misses(m, r);
  EXPECT_GT(p.cpu.size(), p.copy.size());
  EXPECT_DOUBLE_EQ(p.expected_s(), best_time(m, r));
  const double copy_one = double(kRecord) / r.h2d_bytes_per_s + r.gpu_expert_s;
  EXPECT_LE(std::abs(p.gpu_s - p.cpu_s), std::max(copy_one, r.cpu_expert_s));
  EXPECT_LT(p.expected_s(), cost_of(m, r, 0).expected_s() / 1.5);  // copying them all is much slower
}

// The copies land faster than the CPU computes: the CPU still takes a share once the copy stream
// would be busy longer than the CPU's round trip and one expert.
TEST(Placement, AFastCopyStreamKeepsMoreMissesOnTheGpu) {
  const LayerMisses m = misses(8, 2);
  const Placement slow = place_misses(m, pcie(25)), fast = place_misses(m, pcie(54.8));
  EXPECT_GT(fast.copy.size(), slow.copy.size());
  EXPECT_DOUBLE_EQ(fast.expected_s(), best_time(m, pcie(54.8)));
  // A single miss: the CPU's round trip makes it dearer than the copy.
  EXPECT_EQ(place_misses(misses(1), pcie(54.8)).copy.size(), 1u);
}

// The experts most worth keeping are the ones copied (they serve later tokens from VRAM).
TEST(Placement, TheFirstMissesAreCopiedAndTheRestComputed) {
  const LayerMisses m = misses(8, 2);
  const Placement p = place_misses(m, pcie(40));
  ASSERT_FALSE(p.copy.empty());
  ASSERT_FALSE(p.cpu.empty());
  std::vector<int> joined = p.copy;
  joined.insert(joined.end(), p.cpu.begin(), p.cpu.end());
  EXPECT_EQ(joined, m.experts);
}

// Copies already queued (prefetch) delay the layer's own: more goes to the CPU.
TEST(Placement, ACopyBacklogMovesMissesToTheCpu) {
  const PlacementRates r = pcie(54.8);
  const Placement idle = place_misses(misses(6, 4), r), busy = place_misses(misses(6, 4, 200e-6), r);
  EXPECT_GT(busy.cpu.size(), idle.cpu.size());
  EXPECT_DOUBLE_EQ(busy.expected_s(), best_time(misses(6, 4, 200e-6), r));
}

// Where two splits cost the same, the one copying more wins.
TEST(Placement, TiesKeepTheCopies) {
  PlacementRates r{.h2d_bytes_per_s = 1e9, .gpu_expert_s = 0, .cpu_expert_s = 1e-3, .cpu_round_trip_s = 0};
  LayerMisses m = misses(2);
  m.record_bytes = 1'000'000;  // a copy costs 1 ms, as the CPU's compute does
  const Placement p = place_misses(m, r);
  EXPECT_EQ(p.copy.size(), 1u);  // 1 ms a side beats 2 ms on either
  m.experts.resize(1);
  EXPECT_EQ(place_misses(m, r).copy.size(), 1u);  // 1 ms either way: copied
}

// A prompt chunk: an expert serving u tokens costs the CPU cpu_expert_s + (u − 1)·cpu_token_s
// and its rows' trips over the link, a copy the same whatever u. The experts serving many tokens
// are copied, the CPU takes the tail of experts serving few.
TEST(Placement, APromptChunkCopiesTheExpertsServingTheMostTokens) {
  PlacementRates r = pcie(25);
  r.cpu_token_s = 12e-6;
  LayerMisses m = misses(10, 6);
  m.users = {60, 31, 17, 9, 4, 2, 1, 1, 1, 1};  // most first, as the caller orders them
  m.row_bytes = 8192;
  EXPECT_DOUBLE_EQ(m.cpu_expert_s(4, r), 40e-6 + 3 * 12e-6 + 4 * 8192 / 25e9);
  EXPECT_DOUBLE_EQ(cost_of(m, r, 2).cpu_s, r.cpu_round_trip_s + 2 * (40e-6 + 8192 / 25e9));
  const Placement p = place_misses(m, r);
  EXPECT_DOUBLE_EQ(p.expected_s(), best_time(m, r));
  ASSERT_FALSE(p.copy.empty());
  ASSERT_FALSE(p.cpu.empty());
  EXPECT_EQ(p.copy.front(), 100);  // the expert of 60 tokens
  EXPECT_EQ(p.cpu.back(), 109);
  // Counted as single tokens, the same misses would send more to the CPU.
  LayerMisses single = m;
  single.users.clear();
  EXPECT_GT(place_misses(single, r).cpu.size(), p.cpu.size());
}

TEST(RateEstimate, StartsFromTheMeasuredRateAndFollowsSamples) {
  RateEstimate e(10.0, 0.5);
  e.add(20.0);
  EXPECT_DOUBLE_EQ(e.value(), 15.0);
  e.add(0.0);  // a timer that read nothing
  e.add(std::nan(""));
  e.add(-3.0);
  EXPECT_DOUBLE_EQ(e.value(), 15.0);
  EXPECT_EQ(e.samples(), 1);
  RateEstimate unmeasured;  // no rate at start: the first sample is it
  unmeasured.add(7.0);
  EXPECT_DOUBLE_EQ(unmeasured.value(), 7.0);
}

}  // namespace
}  // namespace ms
