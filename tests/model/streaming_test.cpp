// DESIGN.md invariants 1 and 2: a streamed run is bit-identical to the all-resident run at every
// pool size the engine accepts, for every policy and I/O engine; prefill routes more distinct
// experts than small pools hold, so it runs in waves. CI samples the sizes top_k, top_k+1, a
// middle size and all experts; MOESTREAM_FULL_SWEEP=1 tries every size.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "streaming_support.h"
#include "backends/load.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_support.h"
#include "util/error.h"
#include "writers/convert.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

using test::RunResult;

RunResult run_model(const std::string& dir, const ModelOptions& opt, const std::vector<int>& prompt, int n_new) {
  return test::run_prompt(*load_model(dir, opt), prompt, n_new);
}

std::vector<int> sizes_to_check(int top_k, int n_experts) {
  if (std::getenv("MOESTREAM_FULL_SWEEP")) {
    std::vector<int> all;
    for (int s = top_k; s <= n_experts; ++s) all.push_back(s);
    return all;
  }
  return {top_k, top_k + 1, (top_k + n_experts) / 2, n_experts};
}

void check_streaming_is_exact(const std::string& dir, const std::vector<int>& prompt, int n_new) {
  const ModelConfig cfg = load_config(dir);
  const RunResult want = run_model(dir, {}, prompt, n_new);
  for (int slots : sizes_to_check(cfg.top_k, cfg.n_experts))
    for (PolicyKind policy : {PolicyKind::LRU, PolicyKind::LFU, PolicyKind::LRFU})
      for (IoKind io : {IoKind::Uring, IoKind::Pread}) {
        ModelOptions opt;
        opt.experts = {.slots = slots, .policy = policy, .io = io};
        const RunResult got = run_model(dir, opt, prompt, n_new);
        ASSERT_EQ(got.logits.size(), want.logits.size());
        ASSERT_EQ(std::memcmp(got.logits.data(), want.logits.data(), want.logits.size() * sizeof(float)), 0)
            << "logits differ at " << slots << " slots, policy " << policy_name(policy) << ", io " << int(io);
        ASSERT_EQ(got.tokens, want.tokens) << slots << " slots, policy " << policy_name(policy);
      }
}

std::vector<int> prompt_of(int n, int vocab) {
  std::vector<int> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + 11) % vocab);
  return p;
}

TEST(Streaming, Qwen3NextTinyBf16RecordsAreBitIdenticalAtEveryPoolSize) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", src);
  const std::string dir = test::scratch_dir("stream") + "/next16";
  convert_checkpoint({.from = src, .out = dir, .expert_bits = 16});
  check_streaming_is_exact(dir, prompt_of(41, 1024), 6);
}

TEST(Streaming, PycoderQ4IsBitIdenticalAtEveryPoolSize) {
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  ASSERT_TRUE(fs::exists(dir + "/moestream.json")) << "the embedded model is part of the repository";
  check_streaming_is_exact(dir, prompt_of(48, 8192), 6);
}

TEST(Streaming, PinnedExpertsKeepTheAnswerAndLeaveRoomForOneToken) {
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  const std::vector<int> prompt = prompt_of(48, 8192);
  const RunResult want = run_model(dir, {}, prompt, 4);
  ModelOptions opt;
  opt.experts.slots = 11;
  for (int l = 0; l < 8; ++l) opt.experts.pins[l] = {l, 100 + l, 127};
  const RunResult got = run_model(dir, opt, prompt, 4);
  EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), want.logits.size() * sizeof(float)), 0);
  EXPECT_EQ(got.tokens, want.tokens);
  opt.experts.pins[0] = {1, 2, 3, 4};  // 11 - 4 < top-8
  test::expect_error([&] { load_model(dir, opt); }, {"pinning 4 experts", "model.layers.0.mlp"});
}

TEST(Streaming, PoolBelowOneTokensExpertsIsRefused) {
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  ModelOptions opt;
  opt.experts.slots = 7;
  try {
    load_model(dir, opt);
    FAIL() << "7 slots < top-8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold one token's 8 routed experts"), std::string::npos) << e.what();
  }
}

// A checkpoint directory streams nothing: --memory's floor is its weights (experts too), the KV
// cache and the activations, and below it the error says to convert the checkpoint.
TEST(Streaming, MemoryBudgetOfACheckpointCountsItsWeights) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", src);
  ModelOptions opt;
  opt.memory_budget = 1ull << 30;
  const MemoryPlan p = load_model(src, opt)->memory_plan();
  EXPECT_GT(p.dense, 4ull << 20);  // the checkpoint's tensors
  EXPECT_GT(p.kv, 0u);
  EXPECT_EQ(p.slots, 0);
  opt.memory_budget = p.fixed() - 1;
  test::expect_error([&] { load_model(src, opt); },
                     {"qwen3-next-tiny", "memory budget", "below the floor", "dense weights", "moestream convert"});
  opt.memory_budget = p.fixed();
  EXPECT_EQ(load_model(src, opt)->memory_plan().total(), p.fixed());
}

// A copy of the embedded model whose blob of layer 2 can be damaged.
std::string damaged_copy(const std::string& tag) {
  const std::string dir = test::scratch_dir(tag) + "/model";
  fs::copy(std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4", dir, fs::copy_options::recursive);
  return dir;
}

std::string error_running(const std::string& dir, const ModelOptions& opt) {
  try {
    run_model(dir, opt, prompt_of(32, 8192), 2);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Streaming, CorruptRecordIsNamedWithVerify) {
  const std::string dir = damaged_copy("corrupt");
  const std::string blob = dir + "/experts/layer_002.bin";
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);  // inside expert 0's record
    f.put('\x5a');
  }
  ModelOptions opt;
  opt.experts.verify = true;
  std::unique_ptr<Model> model;
  std::vector<int> prompt;
  const std::string err = test::first_forward_error(
      [&]() -> Model& {
        model = load_model(dir, opt);
        return *model;
      },
      &prompt);
  ASSERT_FALSE(err.empty()) << "a corrupt record was read without --verify noticing";
  EXPECT_NE(err.find("layer_002.bin"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.2.mlp"), std::string::npos) << err;
  EXPECT_NE(err.find("expert 0"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
}

TEST(Streaming, TruncatedAndMissingBlobsAreNamed) {
  const std::string dir = damaged_copy("truncated");
  const std::string blob = dir + "/experts/layer_005.bin";
  fs::resize_file(blob, fs::file_size(blob) / 2);
  std::string err = error_running(dir, {});
  EXPECT_NE(err.find("layer_005.bin"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.5.mlp"), std::string::npos) << err;

  fs::remove(blob);
  err = error_running(dir, {});
  EXPECT_NE(err.find("layer_005.bin"), std::string::npos) << err;
}

}  // namespace
}  // namespace ms
