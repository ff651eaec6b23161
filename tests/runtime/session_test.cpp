// Text generation sessions on a real model (pycoder-moe): greedy equals the reference, the
// conversation cache is reused without changing the answer, stop strings, seeds, cancelling.
#include "runtime/session.h"

#include <gtest/gtest.h>

#include <atomic>

#include "test_support.h"

namespace ms {
namespace {

class SessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string dir = test::shared_path("models/pycoder-moe");
    if (!dir.empty()) engine_ = Engine::load(dir).release();
  }
  static void TearDownTestSuite() { delete engine_; }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << "models/pycoder-moe not found: set MOESTREAM_SHARED to the shared/ folder";
  }
  static GenerationRequest greedy(const std::string& text, int n) {
    GenerationRequest r;
    r.prompt = engine_->tokenizer().encode(text);
    r.max_tokens = n;
    return r;
  }
  static Engine* engine_;
};
Engine* SessionTest::engine_ = nullptr;

TEST_F(SessionTest, EosIdsComeFromTheModelFiles) {
  // config.json, generation_config.json and tokenizer_config.json all name <|endoftext|> (0).
  EXPECT_EQ(engine_->eos_ids(), std::vector<int>{0});
}

TEST_F(SessionTest, StreamedTextIsTheDecodedTokens) {
  Session s(*engine_);
  std::string streamed;
  GenerationResult r = s.generate(greedy("import os\n\ndef main(", 40), [&](const std::string& piece) {
    streamed += piece;
    return true;
  });
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.text, engine_->tokenizer().decode(r.tokens));
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.tokens.size(), 40u);
}

TEST_F(SessionTest, ExtendingTheConversationReusesTheCacheAndKeepsTheAnswer) {
  const std::string turn1 = "class Stack:\n    def __init__(self):\n";
  Session warm(*engine_);
  GenerationResult first = warm.generate(greedy(turn1, 12));
  const std::string turn2 = turn1 + first.text + "\n    def pop(self):\n";
  GenerationResult reused = warm.generate(greedy(turn2, 24));

  Session cold(*engine_);
  GenerationResult fresh = cold.generate(greedy(turn2, 24));
  EXPECT_EQ(fresh.reused_tokens, 0);
  EXPECT_GT(reused.reused_tokens, int(engine_->tokenizer().encode(turn1).size()) - 1);
  EXPECT_EQ(reused.tokens, fresh.tokens);
}

TEST_F(SessionTest, StopStringEndsTheTextBeforeIt) {
  Session s(*engine_);
  GenerationResult full = s.generate(greedy("def add(a, b):\n", 40));
  ASSERT_GT(full.text.size(), 8u);
  const std::string stop = full.text.substr(5, 3);
  GenerationRequest req = greedy("def add(a, b):\n", 40);
  req.stop = {stop};
  Session t(*engine_);
  std::string streamed;
  GenerationResult r = t.generate(req, [&](const std::string& p) {
    streamed += p;
    return true;
  });
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(streamed, r.text);
}

TEST_F(SessionTest, SameSeedSameSample) {
  GenerationRequest req = greedy("for i in range(", 30);
  req.sampling = {.temperature = 0.9f, .top_p = 0.95f, .seed = 1234};
  Session a(*engine_), b(*engine_);
  EXPECT_EQ(a.generate(req).tokens, b.generate(req).tokens);
}

TEST_F(SessionTest, CallbackCancels) {
  Session s(*engine_);
  int pieces = 0;
  GenerationResult r = s.generate(greedy("x = [", 50), [&](const std::string&) { return ++pieces < 3; });
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_LT(r.tokens.size(), 50u);
}

TEST_F(SessionTest, CancelFlagStopsBetweenTokens) {
  Session s(*engine_);
  std::atomic<bool> cancel{false};
  GenerationRequest req = greedy("x = [", 50);
  req.cancel = &cancel;
  int pieces = 0;
  GenerationResult r = s.generate(req, [&](const std::string&) {
    if (++pieces == 2) cancel = true;  // as another thread would
    return true;
  });
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_LT(r.tokens.size(), 50u);
  // Set before the start: nothing is processed.
  GenerationResult none = s.generate(req);
  EXPECT_EQ(none.finish_reason, "cancelled");
  EXPECT_TRUE(none.tokens.empty());
}

TEST_F(SessionTest, DeadlineCutsOffWithTimeoutKeepingTheText) {
  Session s(*engine_);
  GenerationRequest req = greedy("def main(", 100000);
  req.ignore_eos = true;
  req.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  std::string streamed;
  GenerationResult r = s.generate(req, [&](const std::string& p) {
    streamed += p;
    return true;
  });
  EXPECT_EQ(r.finish_reason, "timeout");
  EXPECT_GT(r.tokens.size(), 0u);
  EXPECT_LT(r.tokens.size(), 100000u);
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.text, engine_->tokenizer().decode(r.tokens));
  req.deadline = std::chrono::steady_clock::now();
  EXPECT_EQ(s.generate(req).finish_reason, "timeout");
}

TEST_F(SessionTest, StatsCountEveryRoutedToken) {
  const ModelConfig& cfg = engine_->model().config();
  EngineStats stats(cfg, {});
  Session s(*engine_, &stats);
  GenerationRequest req = greedy("import os\n", 5);
  GenerationResult r = s.generate(req);
  // Every prompt token and every generated token but the last went through the model.
  const uint64_t tokens = uint64_t(r.prompt_tokens) + r.tokens.size() - 1;
  StatsSnapshot snap = stats.snapshot();
  ASSERT_EQ(snap.layers.size(), size_t(cfg.n_layers));
  for (const LayerUsage& l : snap.layers) {
    if (!l.moe) continue;
    EXPECT_EQ(l.routed_total, tokens * uint64_t(cfg.top_k));
    uint64_t sum = 0;
    for (uint64_t n : l.routed) sum += n;
    EXPECT_EQ(sum, l.routed_total);
  }
  EXPECT_GT(snap.resident.state, 0u);
  // Routing is what the model does anyway: the answer is the same without stats.
  Session plain(*engine_);
  EXPECT_EQ(plain.generate(req).tokens, r.tokens);
}

}  // namespace
}  // namespace ms
