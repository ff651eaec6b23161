#pragma once
// Routing traces with the locality of real models, for the replay workload (runtime/workload.h)
// on random-weight synths, whose own routing is uniform (sampled) or one repeated set (greedy).
// Per layer a fixed popularity over the experts (weights 1/rank^skew, ranks shuffled per layer);
// each token keeps each expert of the token before with probability `keep` and draws the rest by
// popularity, without repeats. calibrate_routes picks skew and keep whose trace shows a per-layer
// LRU pool the published curve of 512-expert top-10 models (DESIGN.md).
#include <cstdint>
#include <string>

#include "experts/simulate.h"

namespace ms {

struct RouteSynth {
  int layers = 1, experts = 512, top_k = 10, tokens = 1024;
  double skew = 0.0, keep = 0.0;
  uint64_t seed = 1;
};

// One document of p.tokens tokens; a function of p alone.
RouteTraces synth_routes(const RouteSynth& p);

// The published curve of real 512-expert top-10 models (routing_curve's hit at 1/8 and 1/4 of a
// layer's experts, and reuse): ~0.67, ~0.81, ~0.45.
struct RouteTargets {
  double hit8 = 0.67, hit4 = 0.81, reuse = 0.45;
};

// p with the skew and keep (a grid search over short traces of p's shape) whose curve is closest
// to `target` (squared differences).
RouteSynth calibrate_routes(RouteSynth p, const RouteTargets& target = {});

// t as a trace file load_route_traces reads (docK.routes int16 [layers, T, top_k]).
void write_route_traces(const std::string& path, const RouteTraces& t);

}  // namespace ms
