// A long prompt runs in chunks (ModelOptions::prefill_chunk, Model::next_chunk) whose activations
// the memory plan counts: every position's logits, hidden states and routes are bit-identical to
// one whole forward, on a checkpoint and on a streamed 4-bit engine directory, whatever the
// prompt's length past the last chunk; so are the MTP head's logits.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backends/load.h"
#include "model/model.h"
#include "test_support.h"

namespace ms {
namespace {

constexpr int kWhole = 1 << 20;  // a prefill chunk no prompt here reaches: one forward

std::vector<int> random_ids(int n, int vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> id(1, vocab - 1);
  std::vector<int> ids(static_cast<size_t>(n));
  for (int& t : ids) t = id(gen);
  return ids;
}

ForwardResult run_prompt(const std::string& dir, int chunk, const std::vector<int>& ids) {
  ModelOptions opt;
  opt.prefill_chunk = chunk;
  auto model = load_model(dir, opt);
  State state = model->new_state();
  ForwardResult r = model->forward(ids.data(), int(ids.size()), state,
                                   {.all_logits = true, .hidden = true, .routes = true});
  EXPECT_EQ(state.position(), int(ids.size()));
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_chunked_is_whole(const std::string& dir, int chunk, int T) {
  const int vocab = load_config(dir).vocab;
  const std::vector<int> ids = random_ids(T, vocab, unsigned(T));
  const ForwardResult whole = run_prompt(dir, kWhole, ids), chunked = run_prompt(dir, chunk, ids);
  ASSERT_EQ(whole.logits.size(), size_t(T) * size_t(vocab));
  EXPECT_TRUE(same_bits(chunked.logits, whole.logits)) << dir << ": " << T << " tokens in chunks of " << chunk;
  EXPECT_TRUE(same_bits(chunked.hidden_pre_norm, whole.hidden_pre_norm));
  EXPECT_TRUE(same_bits(chunked.hidden_post_norm, whole.hidden_post_norm));
  EXPECT_EQ(chunked.routes, whole.routes);
  ASSERT_EQ(chunked.router_probs.size(), whole.router_probs.size());
  for (size_t l = 0; l < whole.router_probs.size(); ++l) EXPECT_TRUE(same_bits(chunked.router_probs[l], whole.router_probs[l]));
}

TEST(PrefillChunks, ChunkedPromptIsBitIdenticalToOneForward) {
  const std::string ckpt = test::shared_path("models/pycoder-moe");
  if (ckpt.empty()) GTEST_SKIP() << "models/pycoder-moe not found: set MOESTREAM_SHARED to the shared/ folder";
  // Lengths that end on a chunk, past one by a lone token (which the chunking must not leave
  // alone), and in between.
  for (int T : {512, 700, 513, 641}) expect_chunked_is_whole(ckpt, 128, T);
  expect_chunked_is_whole(ckpt, 256, 1025);
}

TEST(PrefillChunks, StreamedEngineDirectoryChunksBitIdentically) {
  const std::string engine = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
  for (int T : {600, 385}) expect_chunked_is_whole(engine, 128, T);
}

TEST(PrefillChunks, MtpHeadChunksBitIdentically) {
  const std::string dir = test::shared_path("fixtures/qwen3-next-tiny");
  if (dir.empty()) GTEST_SKIP() << "fixtures/qwen3-next-tiny not found: set MOESTREAM_SHARED to the shared/ folder";
  const std::vector<int> ids = random_ids(450, load_config(dir).vocab, 7);
  std::vector<float> mtp[2];
  for (int i = 0; i < 2; ++i) {
    ModelOptions opt;
    opt.prefill_chunk = i ? 128 : kWhole;
    auto model = load_model(dir, opt);
    ASSERT_TRUE(model->has_mtp());
    State state = model->new_state();
    const ForwardResult r = model->forward(ids.data(), int(ids.size()), state, {.hidden = true});
    mtp[i] = model->mtp_forward(r.hidden_pre_norm.data(), ids.data() + 1, int(ids.size()) - 1, 0, state);
  }
  ASSERT_EQ(mtp[0].size(), size_t(ids.size() - 1) * size_t(load_config(dir).vocab));
  EXPECT_TRUE(same_bits(mtp[1], mtp[0]));
}

TEST(PrefillChunks, NextChunkNeverLeavesALoneToken) {
  ModelOptions opt;
  opt.prefill_chunk = 128;
  auto model = load_model(MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4", opt);
  EXPECT_EQ(model->next_chunk(100), 100);
  EXPECT_EQ(model->next_chunk(128), 128);
  EXPECT_EQ(model->next_chunk(129), 64);  // then 65: as a whole prefill splits the last 129
  EXPECT_EQ(model->next_chunk(130), 128);
  EXPECT_EQ(model->next_chunk(4000), 128);
  for (int remaining = 1; remaining < 2000; ++remaining) {
    const int n = model->next_chunk(remaining);
    EXPECT_TRUE(n == remaining || (n <= 128 && n % 64 == 0 && remaining - n != 1)) << remaining << " -> " << n;
  }
}

TEST(PrefillChunks, ChunkThatSplitsDeltaNetsChunksIsRefused) {
  for (int chunk : {0, 64, 100, -128}) {
    ModelOptions opt;
    opt.prefill_chunk = chunk;
    test::expect_error([&] { load_model(MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4", opt); },
                       {"prefill chunk", std::to_string(chunk)});
  }
}

TEST(PrefillChunks, PlanCountsTheChunksActivations) {
  ModelOptions small, large;
  small.memory_budget = large.memory_budget = uint64_t(200) << 20;
  small.prefill_chunk = 128;
  large.prefill_chunk = 1024;
  const auto a = load_model(MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4", small);
  const auto b = load_model(MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4", large);
  EXPECT_GT(b->memory_plan().activations, 6 * a->memory_plan().activations);
  EXPECT_EQ(a->memory_plan().total() <= small.memory_budget, true);
  EXPECT_GE(a->memory_plan().slots, b->memory_plan().slots);
  // A context shorter than a chunk holds no longer prompt: its activations are the context's.
  ModelOptions short_context = large;
  short_context.context = 256;
  const auto c = load_model(MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4", short_context);
  EXPECT_LT(c->memory_plan().activations, b->memory_plan().activations / 3);
}

}  // namespace
}  // namespace ms
