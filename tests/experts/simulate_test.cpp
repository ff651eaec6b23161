// simulate against the hit rates ../shared/README.md gives for the pycoder-moe traces.
#include "experts/simulate.h"

#include <gtest/gtest.h>

#include "test_support.h"
#include "util/error.h"

namespace ms {
namespace {

TEST(Simulate, LruAndBeladyMatchThePublishedFigures) {
  MS_REQUIRE_SHARED("models/pycoder-moe/routes.safetensors", path);
  RouteTraces t = load_route_traces(path, 128);
  ASSERT_EQ(t.routes.size(), 24u);
  struct Want {
    int slots;
    double lru, belady;
  };
  for (Want w : {Want{8, 0.419, 0.419}, Want{16, 0.631, 0.769}, Want{32, 0.851, 0.926}}) {
    EXPECT_NEAR(simulate_policy(t, w.slots, PolicyKind::LRU).total_hit_rate(), w.lru, 0.0005) << w.slots;
    const double opt = simulate_belady(t, w.slots).total_hit_rate();
    EXPECT_NEAR(opt, w.belady, 0.0005) << w.slots;
    for (PolicyKind p : {PolicyKind::LFU, PolicyKind::LRFU}) {
      const double h = simulate_policy(t, w.slots, p).total_hit_rate();
      EXPECT_LE(h, opt + 1e-12) << "no online policy beats the offline optimum";
      std::printf("slots %d %s: hit rate %.3f = %.3f of Belady\n", w.slots, policy_name(p), h, h / opt);
    }
  }
}

TEST(Simulate, TooFewSlotsForOneTokenIsRefused) {
  MS_REQUIRE_SHARED("models/pycoder-moe/routes.safetensors", path);
  RouteTraces t = load_route_traces(path, 128);
  EXPECT_THROW(simulate_policy(t, 7, PolicyKind::LRU), Error);
}

}  // namespace
}  // namespace ms
