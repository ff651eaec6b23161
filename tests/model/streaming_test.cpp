// DESIGN.md invariants 1 and 2: a streamed run is bit-identical to the all-resident run at every
// pool size the engine accepts, for every policy and I/O engine, with prefetch off and on;
// prefill routes more distinct experts than small pools hold, so it runs in waves. CI samples the
// sizes top_k, top_k+1, a middle size and all experts; MOESTREAM_FULL_SWEEP=1 tries every size
// (and every prefetch staging size, schedule and width below at each of them).
//
// Prediction runs only in forwards of at most kPredictMaxTokens tokens: the prompts here are
// longer, so their logits come from forwards that predict nothing, while the greedy decode
// (generate_greedy) and the decode logits (one token a forward) predict at every layer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "streaming_support.h"
#include "backends/load.h"
#include "model/model.h"
#include "model/predict.h"
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

// What run_prompt gives (the prompt's logits, then greedy tokens from a fresh state), then the
// logits of each decode step (the prompt, then the greedy tokens one forward each), and what the
// prefetcher had done after each part.
struct DecodeRun {
  RunResult run;
  std::vector<float> step_logits;
  bool prefetching = false;
  PrefetchStats after_prompt;    // the prefetch counters after the prompt's forward
  PrefetchStats after_generate;  // ... after generate_greedy
  PrefetchStats prefetch;        // ... after the decode steps: all
  int width = 0, staging_buffers = 0;
  double mean_width = 0;
};

PrefetchStats prefetch_counts(const Model& m) {
  PrefetchStats p;
  if (m.experts())
    for (const LayerStats& l : m.experts()->stats()) p += l.prefetch;
  return p;
}

DecodeRun run_decode(const std::string& dir, const ModelOptions& opt, const std::vector<int>& prompt, int n_new) {
  std::unique_ptr<Model> model = load_model(dir, opt);
  DecodeRun r;
  r.prefetching = model->experts() && model->experts()->prefetching();
  {  // test::run_prompt, counted part by part
    State s = model->new_state();
    r.run.logits = model->forward(prompt.data(), int(prompt.size()), s, {.all_logits = true}).logits;
    r.after_prompt = prefetch_counts(*model);
    State g = model->new_state();
    r.run.tokens = generate_greedy(*model, g, prompt, {.max_tokens = n_new, .stop_at_eos = false});
    r.after_generate = prefetch_counts(*model);
  }
  State s = model->new_state();
  model->forward(prompt.data(), int(prompt.size()), s, {.logits = false});
  for (int t : r.run.tokens) {
    const std::vector<float> l = model->forward(&t, 1, s).logits;
    r.step_logits.insert(r.step_logits.end(), l.begin(), l.end());
  }
  r.prefetch = prefetch_counts(*model);
  if (r.prefetching) {
    r.width = model->experts()->prefetch_width();
    r.mean_width = model->experts()->mean_prefetch_width();
    r.staging_buffers = model->experts()->staging_buffers();
  }
  return r;
}

std::vector<int> sizes_to_check(int top_k, int n_experts) {
  if (std::getenv("MOESTREAM_FULL_SWEEP")) {
    std::vector<int> all;
    for (int s = top_k; s <= n_experts; ++s) all.push_back(s);
    return all;
  }
  return {top_k, top_k + 1, (top_k + n_experts) / 2, n_experts};
}

const char* io_label(IoKind io) { return io == IoKind::Uring ? "uring" : io == IoKind::Pread ? "pread" : "auto"; }

// got == want bit for bit: the prompt's logits, each decode step's logits, the greedy tokens.
void expect_identical(const DecodeRun& got, const DecodeRun& want, const std::string& what) {
  ASSERT_EQ(got.run.logits.size(), want.run.logits.size()) << what;
  EXPECT_EQ(std::memcmp(got.run.logits.data(), want.run.logits.data(), want.run.logits.size() * sizeof(float)), 0)
      << "prompt logits differ: " << what;
  ASSERT_EQ(got.step_logits.size(), want.step_logits.size()) << what;
  EXPECT_EQ(std::memcmp(got.step_logits.data(), want.step_logits.data(), want.step_logits.size() * sizeof(float)), 0)
      << "decode logits differ: " << what;
  EXPECT_EQ(got.run.tokens, want.run.tokens) << what;
}

// Where a run prefetched (prefetch on): a prompt longer than kPredictMaxTokens predicted nothing
// in its forward, generate_greedy's decode steps and the one-token forwards did.
void expect_prefetched(const DecodeRun& r, int prompt_tokens, const std::string& what) {
  ASSERT_TRUE(r.prefetching) << what;
  if (prompt_tokens > kPredictMaxTokens)
    EXPECT_EQ(r.after_prompt.predicted, 0u) << "a forward of " << prompt_tokens << " tokens predicted: " << what;
  else
    EXPECT_GT(r.after_prompt.predicted, 0u) << "a prompt of " << prompt_tokens << " tokens predicted nothing: " << what;
  EXPECT_GT(r.after_generate.predicted, r.after_prompt.predicted) << "generate_greedy predicted nothing: " << what;
  EXPECT_GT(r.prefetch.predicted, r.after_generate.predicted) << "the decode steps predicted nothing: " << what;
}

void check_streaming_is_exact(const std::string& dir, const std::vector<int>& prompt, int n_new) {
  const ModelConfig cfg = load_config(dir);
  ASSERT_GT(int(prompt.size()), kPredictMaxTokens);
  const DecodeRun want = run_decode(dir, {}, prompt, n_new);
  ASSERT_FALSE(want.prefetching) << "all resident: nothing to prefetch";
  PrefetchStats total;
  for (int slots : sizes_to_check(cfg.top_k, cfg.n_experts))
    for (PolicyKind policy : {PolicyKind::LRU, PolicyKind::LFU, PolicyKind::LRFU})
      for (IoKind io : {IoKind::Uring, IoKind::Pread})
        for (PrefetchMode mode : {PrefetchMode::Off, PrefetchMode::On}) {
          ModelOptions opt;
          opt.experts = {.slots = slots, .policy = policy, .io = io};
          opt.experts.prefetch.mode = mode;
          const std::string what = fmt::format("{} slots, policy {}, io {}, prefetch {}", slots, policy_name(policy),
                                               io_label(io), mode == PrefetchMode::On ? "on" : "off");
          const DecodeRun got = run_decode(dir, opt, prompt, n_new);
          expect_identical(got, want, what);
          if (mode == PrefetchMode::Off) {
            EXPECT_FALSE(got.prefetching) << what;
          } else {
            expect_prefetched(got, int(prompt.size()), what);
            if (slots < cfg.n_experts) total += got.prefetch;
          }
          if (::testing::Test::HasFailure()) return;
        }
  // Over the streamed runs, predictions were read ahead and promoted: the prefetch path ran.
  EXPECT_GT(total.issued, 0u);
  EXPECT_GT(total.used, 0u);
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
std::string damaged_copy(const std::string& tag) { return test::embedded_model_copy(tag); }

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
  // Loaded whole (every expert fits), the load reads it and names it.
  test::expect_error([&] { load_model(dir, opt); }, {"layer_002.bin", "model.layers.2.mlp", "expert 0", "checksum"});
  // Read as routed, the forward that routes to it names it.
  opt.load_whole = false;
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

// Prefetch's knobs change what is read ahead and when, never the answer: staging of 1, 2, top_k
// buffers and the default; two layers ahead, early/late schedules and fixed widths; and a prompt
// short enough that its prefill predicts too (several tokens a prediction). At one policy, the
// two smallest pools (most misses) and a middle one.
struct PrefetchCase {
  std::string name;
  std::string ahead = "1";
  int width = 0, staging = 0;
};

std::vector<PrefetchCase> prefetch_cases(int top_k) {
  return {{"staging 1", "1", 0, 1},
          {"staging 2", "1", 0, 2},
          {"staging top_k", "1", 0, top_k},
          {"staging default", "1", 0, 0},
          {"ahead 2", "2", 0, 0},
          {"ahead 2,1@4", "2,1@4", 0, 0},
          {"ahead 1,3@2", "1,3@2", 0, 3},
          {"width 1", "1", 1, 0},
          {"width 3, ahead 2", "2", 3, 0},
          {"width 2 top_k, staging 2", "1", 2 * top_k, 2}};
}

void check_prefetch_variants(const std::string& dir, const std::vector<int>& prompt, int n_new, IoKind io) {
  const ModelConfig cfg = load_config(dir);
  const DecodeRun want = run_decode(dir, {}, prompt, n_new);
  std::vector<int> sizes = {cfg.top_k, cfg.top_k + 1};
  if (std::getenv("MOESTREAM_FULL_SWEEP")) sizes = sizes_to_check(cfg.top_k, cfg.n_experts);
  for (const PrefetchCase& c : prefetch_cases(cfg.top_k))
    for (int slots : sizes) {
      ModelOptions opt;
      opt.experts = {.slots = slots, .policy = PolicyKind::LRFU, .io = io};
      opt.experts.prefetch = {.mode = PrefetchMode::On, .width = c.width, .staging = c.staging};
      parse_prefetch_ahead(c.ahead, opt.experts.prefetch);
      const std::string what = fmt::format("{}: {} slots, io {}", c.name, slots, io_label(io));
      const DecodeRun got = run_decode(dir, opt, prompt, n_new);
      expect_identical(got, want, what);
      expect_prefetched(got, int(prompt.size()), what);
      if (c.width > 0) {
        EXPECT_EQ(got.width, c.width) << "a fixed width stays fixed: " << what;
        EXPECT_DOUBLE_EQ(got.mean_width, double(c.width)) << what;
      } else {
        EXPECT_GE(got.width, min_prefetch_width(cfg.top_k)) << what;
        EXPECT_LE(got.width, max_prefetch_width(cfg.top_k)) << what;
      }
      EXPECT_EQ(got.staging_buffers, c.staging ? c.staging : staging_buffers(opt.experts.prefetch, cfg.top_k)) << what;
      if (::testing::Test::HasFailure()) return;
    }
}

TEST(Streaming, PrefetchStagingScheduleAndWidthKeepThePycoderAnswer) {
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  check_prefetch_variants(dir, prompt_of(40, 8192), 6, IoKind::Uring);
}

TEST(Streaming, PrefetchVariantsKeepTheQwen3NextTinyAnswerThroughPread) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", src);
  const std::string dir = test::scratch_dir("stream-prefetch") + "/next16";
  convert_checkpoint({.from = src, .out = dir, .expert_bits = 16});
  check_prefetch_variants(dir, prompt_of(24, 1024), 6, IoKind::Pread);
}

// A prompt of at most kPredictMaxTokens: its prefill predicts for all its tokens at once (the
// width times the tokens), one token more predicts nothing; the logits and tokens are still the
// all-resident run's.
TEST(Streaming, ShortPromptsPredictInTheirPrefillAndKeepTheAnswer) {
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  const ModelConfig cfg = load_config(dir);
  for (int n : {1, 5, kPredictMaxTokens, kPredictMaxTokens + 1}) {
    const std::vector<int> prompt = prompt_of(n, 8192);
    const DecodeRun want = run_decode(dir, {}, prompt, 4);
    for (IoKind io : {IoKind::Uring, IoKind::Pread})
      for (int slots : {cfg.top_k, cfg.top_k + 3}) {
        ModelOptions opt;
        opt.experts = {.slots = slots, .policy = PolicyKind::LRU, .io = io};
        opt.experts.prefetch.mode = PrefetchMode::On;
        const std::string what = fmt::format("prompt of {}: {} slots, io {}", n, slots, io_label(io));
        const DecodeRun got = run_decode(dir, opt, prompt, 4);
        expect_identical(got, want, what);
        expect_prefetched(got, int(prompt.size()), what);
        if (::testing::Test::HasFailure()) return;
      }
  }
}

}  // namespace
}  // namespace ms
