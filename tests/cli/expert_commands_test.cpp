// simulate, profile and the streaming flags through the built binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace ms {
namespace {

TEST(SimulateCommand, PrintsPolicyLruAndBelady) {
  MS_REQUIRE_SHARED("models/pycoder-moe/routes.safetensors", routes);
  std::string out, err;
  ASSERT_EQ(test::run_cli("simulate --routes " + routes + " --slots 16 --policy lfu --experts 128", &out, &err), 0) << err;
  EXPECT_NE(out.find("total    0.673    0.631    0.769"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("simulate --routes " + routes + " --slots 4", &out, &err), 1);
  EXPECT_NE(err.find("4 slots cannot hold one token's 8 experts"), std::string::npos) << err;
  EXPECT_EQ(test::run_cli("simulate --routes " + routes + " --slots 16 --policy fifo", &out, &err), 2);
}

TEST(ProfileCommand, WritesCapsThatRunAccepts) {
  const std::string dir = test::scratch_dir("profile");
  std::ofstream(dir + "/prompts.txt") << "def fib(n):\nimport os\n";
  std::string out, err;
  ASSERT_EQ(test::run_cli("profile --prompts " + dir + "/prompts.txt --out " + dir + "/p.json --max-tokens 8", &out, &err), 0) << err;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/p.json"));
  ASSERT_EQ(j["layer_caps"].size(), 8u);
  for (auto& [layer, cap] : j["layer_caps"].items()) {
    EXPECT_GE(cap.get<int>(), 8) << layer;
    EXPECT_LE(cap.get<int>(), 128) << layer;
  }
  ASSERT_EQ(test::run_cli("run --prompt 'def f(' --max-tokens 4 --stats --pool-profile " + dir + "/p.json", &out, &err), 0) << err;
  EXPECT_NE(err.find("disk_load_ratio"), std::string::npos) << err;
  std::ofstream(dir + "/bad.json") << R"({"layer_caps": {"zero": 10}})";
  EXPECT_EQ(test::run_cli("run --prompt x --pool-profile " + dir + "/bad.json", &out, &err), 1);
  EXPECT_NE(err.find("'zero' is not a layer number"), std::string::npos) << err;
}

// A copy of the embedded model in a scratch directory: what runs write beside it stays there.
std::string model_copy(const std::string& tag) {
  const std::string dir = test::scratch_dir(tag) + "/model";
  std::filesystem::copy(MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4", dir, std::filesystem::copy_options::recursive);
  return dir;
}

// A run leaves its usage history beside the model; the next warm-starts from it, and --stats
// says so; a damaged history is a warning, not a failure; --usage off writes nothing.
TEST(WarmStartFlags, UsageHistoryWarmsTheNextRun) {
  const std::string dir = model_copy("warm-cli");
  const std::string run = "run --model " + dir + " --expert-slots 16 --max-tokens 16 --ignore-eos --usage auto ";
  std::string out, err, first;
  ASSERT_EQ(test::run_cli(run + "--prompt 'import os' --stats", &first, &err), 0) << err;
  EXPECT_NE(err.find("pools at load: empty"), std::string::npos) << err;
  ASSERT_TRUE(std::filesystem::exists(dir + "/usage.json"));
  for (const char* mode : {"auto", "pin"}) {
    ASSERT_EQ(test::run_cli(run + "--prompt 'def fib(n):' --stats --warm-start " + std::string(mode), &out, &err), 0) << err;
    EXPECT_NE(err.find(std::string("warm start ") + mode + " read"), std::string::npos) << err;
    EXPECT_NE(err.find(" tokens: hit rate"), std::string::npos) << err;
  }
  std::string plain;
  ASSERT_EQ(test::run_cli(run + "--prompt 'def fib(n):' --warm-start off", &plain, &err), 0) << err;
  EXPECT_EQ(out, plain);  // warm start changes what is resident, not the answer
  std::ofstream(dir + "/usage.json") << "{\"format\": \"moestream-usage\", \"vers";
  ASSERT_EQ(test::run_cli(run + "--prompt x --stats", &out, &err), 0) << err;
  EXPECT_NE(err.find("warning: usage history " + dir + "/usage.json ignored"), std::string::npos) << err;
  std::filesystem::remove(dir + "/usage.json");
  ASSERT_EQ(test::run_cli("run --model " + dir + " --expert-slots 16 --max-tokens 4 --prompt x --usage off", &out, &err), 0);
  EXPECT_FALSE(std::filesystem::exists(dir + "/usage.json"));
}

// profile writes pool_profile.json into the model directory, and later runs use it unless told not to.
TEST(WarmStartFlags, ThePoolProfileBesideTheModelIsTheDefault) {
  const std::string dir = model_copy("profile-default");
  std::ofstream(dir + "/../prompts.txt") << "def fib(n):\n";
  std::string out, err;
  ASSERT_EQ(test::run_cli("profile --model " + dir + " --prompts " + dir + "/../prompts.txt --max-tokens 4", &out, &err), 0) << err;
  ASSERT_TRUE(std::filesystem::exists(dir + "/pool_profile.json"));
  ASSERT_EQ(test::run_cli("run --model " + dir + " --prompt x --max-tokens 2 --stats", &out, &err), 0) << err;
  EXPECT_NE(err.find("pool profile " + dir + "/pool_profile.json"), std::string::npos) << err;
  ASSERT_EQ(test::run_cli("run --model " + dir + " --prompt x --max-tokens 2 --stats --pool-profile none", &out, &err), 0) << err;
  EXPECT_NE(err.find("pool profile none"), std::string::npos) << err;
  ASSERT_EQ(test::run_cli("inspect --model " + dir, &out, &err), 0) << err;
  EXPECT_NE(out.find("pool profile   " + dir + "/pool_profile.json (used by default)"), std::string::npos) << out;
}

TEST(StreamingFlags, MemoryBudgetBelowTheFloorIsRefusedWithTheNumbers) {
  std::string out, err;
  EXPECT_EQ(test::run_cli("run --prompt x --memory 10M", &out, &err), 1);
  EXPECT_NE(err.find("below the floor"), std::string::npos) << err;
  EXPECT_NE(err.find("dense weights"), std::string::npos) << err;
  EXPECT_EQ(test::run_cli("run --prompt x --memory 12Q", &out, &err), 2);  // refused with the flags
  EXPECT_NE(err.find("unknown unit"), std::string::npos) << err;
  ASSERT_EQ(test::run_cli("generate --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --ids 1,2,3 --max-tokens 4 --memory 64M --io pread --no-direct-io --verify --stats", &out, &err), 0) << err;
  EXPECT_NE(err.find("pread"), std::string::npos) << err;
}

// The KV/state share of the plan --stats prints, in MiB, and its slots a layer.
std::pair<double, int> planned_kv_and_slots(const std::string& stats) {
  const size_t kv = stats.find("KV/state "), slots = stats.find(" slots a layer");
  if (kv == std::string::npos || slots == std::string::npos) return {-1, -1};
  const size_t open = stats.rfind('(', slots);
  return {std::stod(stats.substr(kv + 9)), std::stoi(stats.substr(open + 1))};
}

// --context sizes the KV share of the plan: a shorter context leaves the pools more.
TEST(StreamingFlags, ContextSizesTheKvShareOfTheMemoryPlan) {
  const std::string gen = "generate --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --ids 1,2,3 --max-tokens 4 --memory 64M --stats";
  std::string out, err;
  ASSERT_EQ(test::run_cli(gen + " --context 4096", &out, &err), 0) << err;
  const auto [kv_long, slots_long] = planned_kv_and_slots(err);
  ASSERT_EQ(test::run_cli(gen + " --context 64", &out, &err), 0) << err;
  const auto [kv_short, slots_short] = planned_kv_and_slots(err);
  ASSERT_GT(kv_long, 0) << err;
  EXPECT_LT(kv_short, kv_long);
  EXPECT_GE(slots_short, slots_long);
  EXPECT_EQ(test::run_cli(gen + " --context 0", &out, &err), 2);
  EXPECT_NE(err.find("--context"), std::string::npos) << err;
}

}  // namespace
}  // namespace ms
