#pragma once
// Replaying routing traces through the pool without computing: hit rates per layer for a
// policy, and Belady's offline optimum for comparison. Counting as ../shared/README.md does:
// per layer, each document starting cold, a token's experts all resident while it computes
// (never evicted for each other), hits counted per routed expert.
#include <string>
#include <vector>

#include "experts/policy.h"

namespace ms {

// routes[doc][layer][token] = the token's routed experts.
struct RouteTraces {
  int n_layers = 0, top_k = 0, n_experts = 0;
  std::vector<std::vector<std::vector<std::vector<int>>>> routes;
};

// docK.routes int16 [layers, T, top_k] tensors of a safetensors file; n_experts is one more
// than the largest id seen unless given.
RouteTraces load_route_traces(const std::string& path, int n_experts = 0);

struct SimResult {
  std::vector<uint64_t> hits, accesses;  // per layer
  double hit_rate(int layer) const;
  double total_hit_rate() const;
};

SimResult simulate_policy(const RouteTraces& t, int slots, PolicyKind policy);
SimResult simulate_belady(const RouteTraces& t, int slots);

// What a trace's routing shows a per-layer LRU pool: the hit rate at 1/16, 1/8, 1/4 and 1/2 of a
// layer's experts (at least top_k slots), and the share of a token's routed experts that the
// token before routed too. Real 512-expert top-10 models: ~0.67 at 1/8, ~0.81 at 1/4, ~0.45
// reused (DESIGN.md).
struct RoutingCurve {
  double hit[4] = {};
  double reuse = 0;
};
inline constexpr int kCurveFractions[4] = {16, 8, 4, 2};  // a layer's experts divided by these
RoutingCurve routing_curve(const RouteTraces& t);

}  // namespace ms
