// Text generation sessions on a real model (pycoder-moe): greedy equals the reference, the
// conversation cache is reused without changing the answer, stop strings, seeds, cancelling.
#include "runtime/session.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ms
