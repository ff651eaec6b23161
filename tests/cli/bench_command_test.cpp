// bench through the built binary: the bound, each test's row, and bad flags refused.
#include <gtest/gtest.h>

#include <regex>

#include "experts/route_synth.h"
#include "test_support.h"

namespace ms {
namespace {

TEST(BenchCommand, TimesPromptsAndDecodeBesideTheMemoryBound) {
  std::string out, err;
  ASSERT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --prompt 16,32 --tokens 4 --repeat 1",
                          &out, &err),
            0)
      << err;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(memory: read [0-9.]+ GB/s \([0-9]+ threads)"))) << out;
  EXPECT_NE(out.find("every routed expert read into its pool at load"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\npp16 +[0-9.]+\n)"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\npp32 +[0-9.]+\n)"))) << out;
  // tok/s, GB/s of weights read, and that against the measured read bandwidth, for each workload.
  for (const char* w : {"uniform", "text", "greedy"})
    EXPECT_TRUE(std::regex_search(out, std::regex(std::string(R"(\ntg4-)") + w + R"( +[0-9.]+ +[0-9.]+ +0\.[0-9]+\n)")))
        << w << "\n" << out;
}

// Each workload's routing beside real models' curves: on pycoder (a trained model) the text
// workload reuses experts from token to token; the curve's hit rates rise with the slots.
TEST(BenchCommand, WorkloadsReportTheirRoutingCurves) {
  std::string out, err;
  ASSERT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --prompt 0 --tokens 48 --repeat 1 "
                          "--workload text,uniform",
                          &out, &err),
            0)
      << err;
  EXPECT_EQ(out.find("tg48-greedy"), std::string::npos) << out;
  for (const char* w : {"text", "uniform"}) {
    const std::regex line(std::string("routing of ") + w +
                          R"( over 48 tokens: LRU hit rate at 1/16, 1/8, 1/4, 1/2 of a layer's experts ([0-9.]+) / ([0-9.]+) / ([0-9.]+) / ([0-9.]+), reused at the next token ([0-9.]+))");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, line)) << w << "\n" << out;
    EXPECT_LE(std::stod(m[1]), std::stod(m[2]));
    EXPECT_LE(std::stod(m[2]), std::stod(m[3]));
    EXPECT_LE(std::stod(m[3]), std::stod(m[4]));
    EXPECT_GT(std::stod(m[4]), 0.0);
    EXPECT_GT(std::stod(m[5]), 0.0);
  }
  EXPECT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --workload text,zipf", &out, &err), 2);
  EXPECT_NE(err.find("--workload"), std::string::npos) << err;
}

// The replay workload: a trace's routes in place of the router's (one expert set each step here,
// so every step reuses the last one's), announced as not the model's; replay needs a trace, a
// trace needs replay, and no other command takes one.
TEST(BenchCommand, ReplayTakesItsRoutesFromATrace) {
  constexpr int kLayers = 8, kSteps = 16, kTopK = 8;  // pycoder-moe-q4's MoE layers and top-k
  RouteTraces t;
  t.n_layers = kLayers, t.top_k = kTopK, t.n_experts = 128;
  auto& doc = t.routes.emplace_back(size_t(kLayers));
  for (int l = 0; l < kLayers; ++l)
    for (int s = 0; s < kSteps; ++s) {
      std::vector<int>& ids = doc[size_t(l)].emplace_back();
      for (int k = 0; k < kTopK; ++k) ids.push_back(3 * k + l);
    }
  const std::string trace = test::scratch_dir("bench-replay") + "/routes.safetensors";
  write_route_traces(trace, t);
  const std::string model = "bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --prompt 0 --tokens 8 --repeat 1 ";
  std::string out, err;
  ASSERT_EQ(test::run_cli(model + "--workload replay --routes-from " + trace, &out, &err), 0) << err;
  EXPECT_NE(out.find("REPLAY: tg<N>-replay routes every MoE layer by " + trace + " (16 steps), not by its router"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\ntg8-replay"), std::string::npos) << out;
  EXPECT_NE(out.find("routing of replay over 8 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("reused at the next token 1.00"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli(model + "--workload replay", &out, &err), 1);
  EXPECT_NE(err.find("--workload replay needs --routes-from"), std::string::npos) << err;
  EXPECT_EQ(test::run_cli(model + "--workload uniform --routes-from " + trace, &out, &err), 1);
  EXPECT_NE(err.find("add replay to --workload"), std::string::npos) << err;
  EXPECT_EQ(test::run_cli("run --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --prompt hi --routes-from " + trace,
                          &out, &err),
            2);
  EXPECT_NE(err.find("--routes-from"), std::string::npos) << err;
}

TEST(BenchCommand, StreamingPoolsAreSaidToStream) {
  std::string out, err;
  ASSERT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --expert-slots 16 --prompt 0 "
                          "--tokens 2 --repeat 1",
                          &out, &err),
            0)
      << err;
  // pycoder: 8 MoE layers and the MTP head's, 128 experts each.
  EXPECT_NE(out.find("tier ram: 144 slots for 1152 experts over 9 layers (decode streams them), filled as routed"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("\npp"), std::string::npos) << out;
  // Each decode row gives the pools' hit rate and stall share over its runs.
  EXPECT_NE(out.find("  hit 0."), std::string::npos) << out;
  EXPECT_NE(out.find(" %\n"), std::string::npos) << out;
}

TEST(BenchCommand, BadFlagsAreRefused) {
  std::string out, err;
  EXPECT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --repeat 0", &out, &err), 2);
  EXPECT_NE(err.find("--repeat"), std::string::npos) << err;
  EXPECT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --prompt 16,x", &out, &err), 2);
  EXPECT_EQ(test::run_cli("bench --model /nonexistent", &out, &err), 1);
  EXPECT_NE(err.find("/nonexistent"), std::string::npos) << err;
}

}  // namespace
}  // namespace ms
