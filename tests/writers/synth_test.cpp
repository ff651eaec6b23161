// `moestream synth` on the tiny shape: the directory loads as the engine reads any converted
// model, its forward pass is finite, and streaming it through a few expert slots gives the
// same bits as holding every expert.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "format/config.h"
#include "format/engine_dir.h"
#include "backends/load.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "synth_support.h"
#include "test_support.h"
#include "util/error.h"
#include "writers/synth.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::synth_tiny;
using test::slurp;

// Logits of a prefill of `ids` then `decode` greedy single-token steps, concatenated.
std::vector<float> run_logits(const Model& model, const std::vector<int>& ids, int decode) {
  State state = model.new_state();
  ForwardResult r = model.forward(ids.data(), int(ids.size()), state, {.all_logits = true});
  std::vector<float> all = r.logits;
  const int V = model.config().vocab;
  for (int step = 0; step < decode; ++step) {
    const float* last = all.data() + all.size() - size_t(V);
    const int next = int(std::max_element(last, last + V) - last);
    ForwardResult d = model.forward(&next, 1, state);
    all.insert(all.end(), d.logits.begin(), d.logits.end());
  }
  return all;
}

TEST(Synth, TinyModelLoadsWithItsShapeAndFiniteLogits) {
  const std::string dir = synth_tiny("synth-tiny");
  ASSERT_TRUE(is_engine_dir(dir));
  const SynthShape s = synth_shape("tiny");
  auto model = load_model(dir);
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.arch, Arch::Qwen3Next);
  EXPECT_EQ(c.hidden, s.hidden);
  EXPECT_EQ(c.n_layers, s.layers);
  EXPECT_EQ(c.n_experts, s.n_experts);
  EXPECT_EQ(c.layer_types[3], LayerType::FullAttention);
  EXPECT_EQ(c.layer_types[0], LayerType::LinearAttention);
  ASSERT_NE(model->experts(), nullptr);  // experts stream from the blobs

  // Every record matches the checksum the index holds.
  ExpertBlobs blobs(dir, read_engine_index(dir, c));
  ASSERT_EQ(blobs.index().layers.size(), size_t(s.layers));
  for (auto& l : blobs.index().layers)
    for (int e = 0; e < l.n_experts; ++e) blobs.verify(l, e);

  const std::vector<float> logits = run_logits(*model, {3, 17, 5, 200, 9, 42, 1, 300}, 4);
  float max_abs = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    max_abs = std::max(max_abs, std::abs(v));
  }
  EXPECT_GT(max_abs, 0.0f);  // random weights, not all zero
  EXPECT_LT(max_abs, 1e3f);  // scaled to stay in range
}

// --mtp adds a (random) MTP head with its own streamed experts: the model has one, it runs, and
// greedy decoding with its drafts is plain greedy decoding (the drafts are nearly never kept).
TEST(Synth, MtpHeadStreamsAndDraftsWithoutChangingGreedy) {
  const std::string dir = synth_tiny("synth-mtp", 7, true);
  ModelOptions opt;
  opt.experts.slots = 6;
  auto model = load_model(dir, opt);
  ASSERT_TRUE(model->has_mtp());
  EXPECT_EQ(model->experts()->index().layers.size(), size_t(synth_shape("tiny").layers) + 1);
  const std::vector<int> prompt = {3, 17, 5, 200, 9};
  State a = model->new_state(), b = model->new_state();
  const std::vector<int> plain = generate_greedy(*model, a, prompt, {.max_tokens = 24, .stop_at_eos = false});
  SpeculativeStats st;
  EXPECT_EQ(generate_greedy(*model, b, prompt,
                            {.max_tokens = 24, .stop_at_eos = false, .speculative = {.mtp = true, .draft = 2},
                             .speculative_stats = &st}),
            plain);
  EXPECT_GT(st.drafted, 0u);
  // Without --mtp there is no head.
  EXPECT_FALSE(load_model(synth_tiny("synth-no-mtp"))->has_mtp());
}

TEST(Synth, StreamingThroughFewSlotsIsBitIdenticalToAllExperts) {
  const std::string dir = synth_tiny("synth-stream");
  const std::vector<int> ids{3, 17, 5, 200, 9, 42, 1, 300, 77, 8};
  auto all = load_model(dir);
  ModelOptions few;
  few.experts.slots = synth_shape("tiny").top_k;  // a batch routes more than this: waves
  auto streamed = load_model(dir, few);
  const std::vector<float> a = run_logits(*all, ids, 6), b = run_logits(*streamed, ids, 6);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  uint64_t misses = 0;
  for (auto& l : streamed->experts()->stats()) misses += l.pool.misses;
  EXPECT_GT(misses, uint64_t(synth_shape("tiny").n_experts));  // it did evict and reload
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherWeights) {
  const std::string a = synth_tiny("synth-a", 7), b = synth_tiny("synth-b", 7), c = synth_tiny("synth-c", 8);
  for (const char* f : {"moestream.json", "config.json", "dense.safetensors", "experts/layer_000.bin", "experts/layer_003.bin"})
    EXPECT_TRUE(slurp(fs::path(a) / f) == slurp(fs::path(b) / f)) << f;
  EXPECT_FALSE(slurp(fs::path(a) / "experts/layer_000.bin") == slurp(fs::path(c) / "experts/layer_000.bin"));
  EXPECT_FALSE(slurp(fs::path(a) / "dense.safetensors") == slurp(fs::path(c) / "dense.safetensors"));
}

TEST(Synth, ShapeOf80BMatchesQwen3Next80BA3B) {
  const SynthShape s = synth_shape("80b-a3b");
  EXPECT_EQ(s.hidden, 2048);
  EXPECT_EQ(s.vocab, 151936);
  EXPECT_EQ(s.layers, 48);
  EXPECT_EQ(s.n_experts, 512);
  EXPECT_EQ(s.top_k, 10);
  EXPECT_EQ(s.moe_inter, 512);
  EXPECT_EQ(s.shared_inter, 512);
  EXPECT_EQ(s.n_heads, 16);
  EXPECT_EQ(s.n_kv_heads, 2);
  EXPECT_EQ(s.head_dim, 256);
  EXPECT_EQ(s.lin_k_heads, 16);
  EXPECT_EQ(s.lin_v_heads, 32);
  EXPECT_EQ(s.lin_k_dim, 128);
  EXPECT_EQ(s.lin_v_dim, 128);
  EXPECT_EQ(s.full_attention_interval, 4);
  // 4-bit experts, group 64: 3 projections of 512x2048, q 4 bits plus bf16 scale and bias
  // per 64 weights, each record rounded up to 4 KiB.
  SynthOptions opt;
  opt.shape = s;
  opt.shape.layers = 1;
  const size_t record = 3 * (512 * 2048 / 2 + 2 * 512 * 32 * 2);
  EXPECT_GE(synth_bytes(opt), 512 * record);
  EXPECT_THROW(synth_shape("70b"), Error);
}

TEST(Synth, RefusesAnExistingDirectoryUnlessForced) {
  const std::string dir = synth_tiny("synth-force");
  std::string out, err;
  EXPECT_EQ(1, test::run_cli("synth --like tiny --out " + dir, &out, &err));
  EXPECT_NE(err.find("already exists (use --force"), std::string::npos) << err;
  EXPECT_EQ(0, test::run_cli("synth --like tiny --layers 2 --seed 3 --force --out " + dir, &out, &err)) << err;
  EXPECT_EQ(load_config(dir).n_layers, 2);
}

TEST(Synth, RefusesAModelTheDiskCannotHold) {
  const std::string dir = test::scratch_dir("synth-huge") + "/model";
  std::string err;
  EXPECT_EQ(1, test::run_cli("synth --like 80b-a3b --layers 20000 --out " + dir, nullptr, &err));
  EXPECT_NE(err.find("GB free"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir));
}

TEST(Synth, GenerateFromTheCommandLineWithFewSlotsMatchesAllSlots) {
  const std::string dir = test::scratch_dir("synth-cli") + "/model";
  std::string out, err;
  ASSERT_EQ(0, test::run_cli("synth --like tiny --out " + dir, &out, &err)) << err;
  std::string all, few;
  ASSERT_EQ(0, test::run_cli("generate --model " + dir + " --ids 5,6,7 --max-tokens 8 --ignore-eos", &all, &err)) << err;
  ASSERT_EQ(0, test::run_cli("generate --model " + dir + " --ids 5,6,7 --max-tokens 8 --ignore-eos --expert-slots 4 --stats",
                             &few, &err))
      << err;
  EXPECT_EQ(all, few);
  EXPECT_NE(err.find("disk_load_ratio"), std::string::npos) << err;
}

}  // namespace
}  // namespace ms
