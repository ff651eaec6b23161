// Benchmark workloads (runtime/workload.h): parsing, the routing curve a workload's routes give
// a per-layer LRU pool, and the replay workload on the embedded pycoder model (a trace's routes
// in place of the router's).
#include "runtime/workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "backends/load.h"
#include "experts/route_synth.h"
#include "test_support.h"

namespace ms {
namespace {

TEST(Workload, ParsesAListAndNamesWhatItRefuses) {
  const std::vector<WorkloadKind> w = parse_workloads("text,uniform,greedy,replay");
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0], WorkloadKind::Text);
  EXPECT_EQ(w[2], WorkloadKind::Greedy);
  EXPECT_EQ(w[3], WorkloadKind::Replay);
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

using Steps = std::vector<std::vector<std::vector<int>>>;  // [step][layer][top_k]

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
    if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
    model_ = load_model(dir);
  }
  // The routes of n steps of w from a fresh state (seed 1).
  Steps run(const Workload& w, int n) const {
    State state = model_->new_state();
    Steps routes;
    run_workload(*model_, state, w, n, 1, {}, &routes);
    return routes;
  }
  // A trace file of one document of these steps (write_route_traces).
  std::string write_trace(const Steps& steps, const std::string& tag) const {
    RouteTraces t;
    t.n_layers = int(steps[0].size()), t.top_k = int(steps[0][0].size()), t.n_experts = model_->config().n_experts;
    auto& doc = t.routes.emplace_back(steps[0].size());
    for (const auto& step : steps)
      for (size_t l = 0; l < step.size(); ++l) doc[l].push_back(step[l]);
    const std::string path = test::scratch_dir(tag) + "/routes.safetensors";
    write_route_traces(path, t);
    return path;
  }
  // The replay workload of a trace file, its steps rotated so that seed 1's first step is step 0.
  Workload replay(const std::string& path) const {
    Workload w{WorkloadKind::Replay, {}, replay_steps(load_route_traces(path, model_->config().n_experts), model_->config(), path)};
    std::rotate(w.routes.rbegin(), w.routes.rbegin() + long(997 % w.routes.size()), w.routes.rend());
    return w;
  }
  std::unique_ptr<Model> model_;
};

// A forward given the router's own routes (ForwardOptions::routes_from) gives the logits of the
// forward that chose them, bit for bit: the router's probabilities weight forced ids as they
// weight its top-k. Another route changes them.
TEST_F(ReplayTest, ForcedRoutesWeighAsTheRoutersOwn) {
  const std::vector<int> ids{11, 402, 77, 1900, 5, 63};
  State state = model_->new_state();
  const State::Checkpoint start = state.checkpoint();
  ForwardOptions fo;
  fo.routes = true;
  fo.all_logits = true;
  const ForwardResult natural = model_->forward(ids.data(), int(ids.size()), state, fo);
  state.restore(start);
  ForwardOptions forced;
  forced.all_logits = true;
  forced.routes_from = &natural.routes;
  EXPECT_EQ(model_->forward(ids.data(), int(ids.size()), state, forced).logits, natural.logits);
  std::vector<std::vector<int>> other = natural.routes;
  for (auto& layer : other)
    if (!layer.empty()) std::swap(layer[0], layer[1]);  // the same experts, another order: the same sums
  state.restore(start);
  forced.routes_from = &other;
  EXPECT_EQ(model_->forward(ids.data(), int(ids.size()), state, forced).logits, natural.logits);
  const int K = model_->config().top_k;
  for (auto& layer : other)
    for (size_t t = 0; t < layer.size(); t += size_t(K)) {  // each token's first slot: an expert it did not route to
      int e = 0;
      while (std::find(layer.begin() + long(t), layer.begin() + long(t) + K, e) != layer.begin() + long(t) + K) ++e;
      layer[t] = e;
    }
  state.restore(start);
  EXPECT_NE(model_->forward(ids.data(), int(ids.size()), state, forced).logits, natural.logits);
}

// The router's own routes replayed take the same steps: the same routes, so the same weights,
// logits and greedy tokens (each step's routes depend on the tokens before).
TEST_F(ReplayTest, ItsOwnRoutesReplayedRouteTheSame) {
  constexpr int kSteps = 10;
  const Steps natural = run({WorkloadKind::Greedy, {}, {}}, kSteps);
  ASSERT_EQ(natural.size(), size_t(kSteps));
  const Steps replayed = run(replay(write_trace(natural, "replay-same")), kSteps);
  EXPECT_EQ(replayed, natural);
}

// Other routes replace the router's: every step routes as the trace says (here each layer's
// experts shifted by one), not as the router would.
TEST_F(ReplayTest, ATraceDecidesTheRoutes) {
  constexpr int kSteps = 8;
  const Steps natural = run({WorkloadKind::Uniform, {}, {}}, kSteps);
  Steps shifted = natural;
  const int E = model_->config().n_experts;
  for (auto& step : shifted)
    for (auto& layer : step)
      for (int& e : layer) e = (e + 1) % E;
  const Steps replayed = run(replay(write_trace(shifted, "replay-shifted")), kSteps);
  EXPECT_EQ(replayed, shifted);
  EXPECT_NE(replayed, natural);
}

// A trace that does not fit the model is refused naming the file: its layers, its top-k, its
// expert ids; and routes that repeat an expert within a token are refused by the forward.
TEST_F(ReplayTest, RefusesATraceThatDoesNotFit) {
  const Steps natural = run({WorkloadKind::Uniform, {}, {}}, 4);
  const ModelConfig& cfg = model_->config();
  Steps fewer_layers = natural, wider = natural, out_of_range = natural;
  for (auto& s : fewer_layers) s.pop_back();
  for (auto& s : wider)
    for (auto& l : s) l.push_back(0);
  out_of_range[2][1][0] = cfg.n_experts;
  for (const auto& [steps, what] : {std::pair{fewer_layers, std::string("MoE layers")}, std::pair{wider, std::string("top-")}}) {
    const std::string path = write_trace(steps, "replay-bad");
    test::expect_error([&] { replay_steps(load_route_traces(path, cfg.n_experts), cfg, path); }, {path, what});
  }
  const std::string path = write_trace(out_of_range, "replay-range");
  test::expect_error([&] { load_route_traces(path, cfg.n_experts); }, {path, "out of range"});
  Steps repeated = natural;
  repeated[1][0][1] = repeated[1][0][0];
  Workload w = replay(write_trace(repeated, "replay-repeat"));
  test::expect_error([&] { run(w, 4); }, {"replayed routes", "twice"});
}

}  // namespace
}  // namespace ms
