// simulate, profile and the streaming flags through the built binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <vector>
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
  // A layer the model does not have (pycoder has 8) is refused, not dropped.
  for (const char* bad : {R"({"layer_caps": {"0": 16, "99": 10}})", R"({"layer_caps": {"0": 16}, "pins": {"8": [1]}})"}) {
    std::ofstream(dir + "/other.json") << bad;
    EXPECT_EQ(test::run_cli("run --prompt x --pool-profile " + dir + "/other.json", &out, &err), 1) << bad;
    EXPECT_NE(err.find(dir + "/other.json: "), std::string::npos) << err;
    EXPECT_NE(err.find(std::string(bad).find("99") != std::string::npos ? "names layer 99" : "names layer 8"), std::string::npos)
        << err;
  }
}

std::string model_copy(const std::string& tag) { return test::embedded_model_copy(tag); }

// The usage.json a run of the embedded model keeps by default: in this process's state
// directory, under the model's id; the line of --stats that names it.
std::string state_usage_path(const std::string& stats) {
  const std::string key = "; usage history ";
  const size_t at = stats.find(key);
  if (at == std::string::npos) return "";
  const size_t from = at + key.size();
  return stats.substr(from, stats.find(';', from) - from);
}

// Every file under dir, relative to it, with its size and modification time.
std::map<std::string, std::string> listing(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    m[std::filesystem::relative(e.path(), dir).string()] =
        e.is_regular_file() ? std::to_string(e.file_size()) + "@" +
                                  std::to_string(e.last_write_time().time_since_epoch().count())
                            : "dir";
  return m;
}

// A run keeps its usage history in the user's state directory, under the model's id, never
// beside the model; the next run warm-starts from it, and --stats and inspect say where it is;
// a damaged history is a warning, not a failure; --usage off writes nothing.
TEST(WarmStartFlags, UsageHistoryWarmsTheNextRun) {
  const std::string dir = model_copy("warm-cli");
  const auto before = listing(dir);
  const std::string run = "run --model " + dir + " --expert-slots 16 --max-tokens 16 --ignore-eos --usage auto ";
  std::string out, err, first;
  ASSERT_EQ(test::run_cli(run + "--prompt 'import os' --stats", &first, &err), 0) << err;
  EXPECT_NE(err.find("pools at load: empty"), std::string::npos) << err;
  const std::string usage = state_usage_path(err);
  EXPECT_EQ(usage.rfind(test::state_home() + "/moestream/", 0), 0u) << err;
  ASSERT_TRUE(std::filesystem::exists(usage)) << usage;
  EXPECT_EQ(listing(dir), before) << "a run wrote into the model directory";
  ASSERT_EQ(test::run_cli("inspect --model " + dir, &out, &err), 0) << err;
  EXPECT_NE(out.find("usage history  " + usage + " (1 runs"), std::string::npos) << out;
  for (const char* mode : {"auto", "pin"}) {
    ASSERT_EQ(test::run_cli(run + "--prompt 'def fib(n):' --stats --warm-start " + std::string(mode), &out, &err), 0) << err;
    EXPECT_NE(err.find(std::string("warm start ") + mode + " read"), std::string::npos) << err;
    EXPECT_NE(err.find(" tokens: hit rate"), std::string::npos) << err;
  }
  std::string plain;
  ASSERT_EQ(test::run_cli(run + "--prompt 'def fib(n):' --warm-start off", &plain, &err), 0) << err;
  EXPECT_EQ(out, plain);  // warm start changes what is resident, not the answer
  std::ofstream(usage) << "{\"format\": \"moestream-usage\", \"vers";
  ASSERT_EQ(test::run_cli(run + "--prompt x --stats", &out, &err), 0) << err;
  EXPECT_NE(err.find("warning: usage history " + usage + " ignored"), std::string::npos) << err;
  std::filesystem::remove(usage);
  ASSERT_EQ(test::run_cli("run --model " + dir + " --expert-slots 16 --max-tokens 4 --prompt x --usage off", &out, &err), 0);
  EXPECT_FALSE(std::filesystem::exists(usage));
  EXPECT_EQ(listing(dir), before) << "a run wrote into the model directory";
}

// A model directory is read-only input: no command but convert, profile and synth (each asked
// to write there) changes it, whatever it does with the usage history.
TEST(ReadOnlyInput, NoRunWritesIntoTheModelDirectory) {
  const std::string dir = model_copy("read-only-input");
  const auto before = listing(dir);
  const std::string scratch = test::scratch_dir("read-only-out");
  const std::string m = " --model " + dir + " --usage auto ";
  for (const std::string& cmd :
       {"run" + m + "--prompt 'def f(' --max-tokens 8 --stats", "run" + m + "--prompt 'import os' --max-tokens 8 --expert-slots 16",
        "generate" + m + "--ids 1,2,3 --max-tokens 4 --memory 64M", "bench" + m + "--prompt 16 --tokens 4 --repeat 1",
        "inspect --model " + dir, "logits" + m + "--ids 1,2,3 --out " + scratch + "/l.safetensors",
        "chat" + m + "--max-tokens 4"}) {
    std::string out, err;
    EXPECT_EQ(test::run_cli(cmd, &out, &err), 0) << cmd << ": " << err;
    EXPECT_EQ(listing(dir), before) << cmd << " wrote into the model directory";
  }
}

// A usage.json beside the model (where older versions kept it) still warms the next run, with a
// note saying where new history goes; the file itself is left as it was.
TEST(WarmStartFlags, AHistoryBesideTheModelIsReadAndNewHistoryGoesToTheStateDirectory) {
  const std::string dir = model_copy("warm-legacy");
  const std::string run = "run --model " + dir + " --expert-slots 16 --max-tokens 8 --ignore-eos --prompt 'def f(' --stats ";
  std::string out, err;
  ASSERT_EQ(test::run_cli(run + "--usage " + dir + "/../old.json", &out, &err), 0) << err;
  std::filesystem::rename(dir + "/../old.json", dir + "/usage.json");
  const std::string old_bytes = test::slurp(dir + "/usage.json");
  ASSERT_EQ(test::run_cli(run + "--usage auto", &out, &err), 0) << err;
  EXPECT_NE(err.find("warm start pin read"), std::string::npos) << err;
  EXPECT_NE(err.find("note: usage history read from " + dir + "/usage.json"), std::string::npos) << err;
  const std::string usage = state_usage_path(err);
  EXPECT_NE(err.find("new history goes to " + usage), std::string::npos) << err;
  EXPECT_TRUE(std::filesystem::exists(usage)) << usage;
  EXPECT_EQ(test::slurp(dir + "/usage.json"), old_bytes);
  ASSERT_EQ(test::run_cli(run + "--usage auto", &out, &err), 0) << err;  // the state directory's, from now on
  EXPECT_EQ(err.find("note: usage history read from"), std::string::npos) << err;
}

// --stats' first tokens count the forward that reached them: after a 64-token prompt and 32 new
// tokens it reports the prompt's hits and misses, not an empty snapshot taken as it began.
TEST(WarmStartFlags, TheFirstTokensHitRateCountsThePrompt) {
  std::string ids;
  for (int i = 0; i < 64; ++i) ids += (i ? "," : "") + std::to_string(100 + 37 * i);
  std::string out, err;
  ASSERT_EQ(test::run_cli("generate --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --expert-slots 16 --ids " + ids +
                              " --max-tokens 32 --ignore-eos --stats",
                          &out, &err),
            0)
      << err;
  const size_t at = err.find("first 64 tokens: hit rate ");
  ASSERT_NE(at, std::string::npos) << err;
  const std::string line = err.substr(at, err.find('\n', at) - at);
  EXPECT_EQ(line.find("(0 hits, 0 misses"), std::string::npos) << line;
  EXPECT_NE(line.find("prompt included"), std::string::npos) << line;
}

// Checksums are checked by default: bytes flipped in every record of an expert blob, or in a
// dense tensor, are an error naming the file and the record or tensor, whether the experts are
// read at load or as routed; --no-verify is the way to run without the checks.
TEST(Checksums, FlippedBytesAreAnErrorByDefault) {
  const std::string dir = model_copy("flipped-records");
  const std::string gen = "generate --model " + dir + " --ids 563,279,1002,14 --max-tokens 8 --ignore-eos";
  std::string want, out, err;
  ASSERT_EQ(test::run_cli(gen, &want, &err), 0) << err;
  const std::string blob = test::flip_expert_records(dir, 3);
  for (const char* flags : {"", " --expert-slots 16", " --memory 64M"}) {
    SCOPED_TRACE(flags);
    EXPECT_EQ(test::run_cli(gen + flags, &out, &err), 1) << out;
    for (const std::string& part : std::vector<std::string>{blob + ": layer model.layers.3.mlp, expert ", "checksum"})
      EXPECT_NE(err.find(part), std::string::npos) << err;
  }
  ASSERT_EQ(test::run_cli(gen + " --no-verify", &out, &err), 0) << err;  // unchecked: it runs (and computes with them)

  const std::string dense_dir = model_copy("flipped-dense");
  test::flip_dense_tensor(dense_dir, "model.layers.1.linear_attn.in_proj_qkvz.weight.q");
  const std::string dense_gen = "generate --model " + dense_dir + " --ids 563,279,1002,14 --max-tokens 8";
  EXPECT_EQ(test::run_cli(dense_gen, &out, &err), 1) << out;
  EXPECT_NE(err.find(dense_dir + "/dense.safetensors: tensor 'model.layers.1.linear_attn.in_proj_qkvz.weight.q': checksum"),
            std::string::npos)
      << err;
  EXPECT_EQ(test::run_cli(dense_gen + " --no-verify", &out, &err), 0) << err;
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
