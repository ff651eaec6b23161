#pragma once
// Decode workloads for benchmarks. Which tokens drive the decode steps decides the routing a
// streamed model's pools see: a random-weight synth routes uniformly when tokens are sampled and
// repeats one expert set when decoding greedily (a token repeats), so a benchmark names its
// workload, and reports how its routing compares with that of real models (lru_curve).
#include <functional>
#include <string>
#include <vector>

#include "experts/simulate.h"
#include "model/model.h"

namespace ms {

enum class WorkloadKind {
  Uniform,  // tokens sampled at temperature 1 (seeded): routing that changes every token
  Text,     // the tokens of a text, teacher-forced: routing that follows the text
  Greedy,   // argmax tokens: on random weights one expert set repeats (an upper bound)
  Replay,   // a routing trace's expert ids replace the router's (benchmarks only: not the model's answer)
};

struct Workload {
  WorkloadKind kind = WorkloadKind::Greedy;
  std::vector<int> text;  // Text: the ids fed, in order (wrapping around)
  // Replay: each step's routes [layer][top_k] (an empty row for a dense layer), in order (wrapping
  // around), as ForwardOptions::routes_from takes them.
  std::vector<std::vector<std::vector<int>>> routes;
  const char* name() const;  // "uniform", "text", "greedy", "replay"
};

// "uniform", "text", "greedy" or "replay", comma-separated; fails naming the item.
std::vector<WorkloadKind> parse_workloads(const std::string& list);

// The replay workload's steps from a routing trace (experts/simulate.h's file: docK.routes [MoE
// layers, T, top_k]), documents one after another. Fails naming the file where the trace's
// layers, top-k or expert ids do not fit the model's.
std::vector<std::vector<std::vector<int>>> replay_steps(const RouteTraces& t, const ModelConfig& cfg,
                                                        const std::string& path);

// n decode steps of w from `state` (after its last token), each a one-token forward whose pick
// runs as a decode step's does; Text feeds w.text[(offset + i) % size], the others their pick
// (Replay: greedy picks, whose tokens then do not matter, with w.routes[(offset + i) % size] as
// the routes).
// on_step(i) after step i; routes (where given) gets each step's routed experts [layer][top_k].
void run_workload(const Model& m, State& state, const Workload& w, int n, unsigned seed,
                  const std::function<void(int)>& on_step = {},
                  std::vector<std::vector<std::vector<int>>>* routes = nullptr);

// experts/simulate.h's routing curve of a workload's routes ([step][MoE layer][top_k]).
RoutingCurve routing_curve(const std::vector<std::vector<std::vector<int>>>& routes, int n_experts, int top_k);

}  // namespace ms
