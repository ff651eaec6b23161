// Text generation sessions on a real model (pycoder-moe): greedy equals the reference, the
// conversation cache is reused without changing the answer, stop strings, seeds, cancelling.
#include "runtime/session.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <functional>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "chat/json_constraint.h"
#include "chat/json_schema.h"
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

// Constrained to a JSON object: every token keeps the text a prefix of one, and it ends, complete,
// at end-of-sequence, greedy and sampled alike.
TEST_F(SessionTest, JsonObjectAnswersAreJsonObjects) {
  for (float temperature : {0.f, 1.f}) {
    Session s(*engine_);
    GenerationRequest req = greedy("def describe_point():\n    return ", 96);
    req.json_object = true;
    req.sampling.temperature = temperature;
    req.sampling.seed = 7;
    const GenerationResult r = s.generate(req);
    JsonAcceptor a;
    EXPECT_TRUE(a.feed(r.text)) << r.text;
    if (r.finish_reason == "stop") {
      EXPECT_TRUE(a.complete()) << r.text;
      EXPECT_TRUE(nlohmann::json::parse(r.text).is_object()) << r.text;
    } else {
      EXPECT_EQ(r.finish_reason, "length");
    }
    std::printf("json_object at temperature %.0f: %s %s\n", temperature, r.finish_reason.c_str(), r.text.c_str());
  }
}

// Samples `prompt` under `schema` at temperature 1 for seeds 1..seeds: every answer is a prefix
// the acceptor takes, and `check` gets each one that ended (not cut by max_tokens), parsed.
// Returns how many ended.
int sample_under_schema(const Engine& engine, const char* schema_json, const std::string& prompt, int seeds,
                        int max_tokens, const std::function<void(const nlohmann::json&, const std::string&)>& check) {
  const auto schema = JsonSchema::compile(nlohmann::ordered_json::parse(schema_json));
  Session s(engine);
  int ended = 0;
  for (int seed = 1; seed <= seeds; ++seed) {
    GenerationRequest req;
    req.prompt = engine.tokenizer().encode(prompt);
    req.max_tokens = max_tokens;
    req.json_schema = schema;
    req.sampling.temperature = 1.f;
    req.sampling.seed = uint64_t(seed);
    const GenerationResult r = s.generate(req);
    SchemaAcceptor a(schema);
    if (!a.feed(r.text)) {  // ends the test's sampling, as an ASSERT would
      ADD_FAILURE() << "seed " << seed << ": not a prefix the acceptor takes: " << r.text;
      return ended;
    }
    if (r.finish_reason != "stop") continue;
    ++ended;
    check(nlohmann::json::parse(r.text), r.text);
  }
  return ended;
}

// Constrained to a JSON schema: over 20 seeds, sampled, every answer that ends (not cut by
// max_tokens) parses and validates, checked here member by member; a cut one is still a prefix
// the acceptor takes.
TEST_F(SessionTest, JsonSchemaAnswersValidate) {
  const int ended = sample_under_schema(
      *engine_, R"({"type": "object", "required": ["x", "kind", "tags"],
    "additionalProperties": false, "properties": {"x": {"type": "integer"}, "kind": {"enum": ["a", "b", null]},
    "tags": {"type": "array", "items": {"type": "string"}}, "note": {"type": ["string", "null"]}}})",
      "def point():\n    return ", 20, 160, [](const nlohmann::json& j, const std::string& text) {
        ASSERT_TRUE(j.is_object()) << text;
        // An integer past int64 parses as a float here; JSON Schema's integer is any whole number.
        const auto& x = j.at("x");
        EXPECT_TRUE(x.is_number_integer() || (x.is_number_float() && std::floor(x.get<double>()) == x.get<double>()))
            << text;
        EXPECT_TRUE(j.at("kind").is_null() || j.at("kind") == "a" || j.at("kind") == "b") << text;
        for (const auto& t : j.at("tags")) EXPECT_TRUE(t.is_string()) << text;
        if (j.contains("note")) {
          EXPECT_TRUE(j["note"].is_string() || j["note"].is_null()) << text;
        }
        for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "x" || k == "kind" || k == "tags" || k == "note") << text;
      });
  std::printf("json_schema: %d of 20 sampled answers ended within 160 tokens\n", ended);
  EXPECT_GT(ended, 0);
}

// The property: every sampled answer of pycoder-moe-q4 under a schema, over 200 seeds, is a
// prefix the acceptor takes, and every one that ends parses and validates (a short schema, so
// that nearly all end within 48 tokens).
TEST(ConstrainedSampling, TwoHundredSeedsParseAndValidate) {
  const auto engine = Engine::load(test::embedded_model_copy("constrained-sampling"));
  const int ended = sample_under_schema(
      *engine, R"({"type": "object", "required": ["ok", "n"], "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}}})",
      "# settings\nconfig = ", 200, 48, [](const nlohmann::json& j, const std::string& text) {
        ASSERT_TRUE(j.at("ok").is_boolean()) << text;
        ASSERT_TRUE(j.at("n") == 1 || j.at("n") == 2 || j.at("n") == 3) << text;
        ASSERT_EQ(j.size(), 2u) << text;
      });
  std::printf("schema-constrained sampling: %d of 200 answers ended within 48 tokens, all valid\n", ended);
  EXPECT_GT(ended, 150);
}

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

// Long prompts run in chunks of 128 tokens here, so that a cancel or a deadline has many chunk
// boundaries to stop at.
class PrefillSessionTest : public ::testing::Test {
 protected:
  using Clock = std::chrono::steady_clock;
  static constexpr int kChunk = 128;
  static void SetUpTestSuite() {
    std::string dir = test::shared_path("models/pycoder-moe");
    ModelOptions opt;
    opt.prefill_chunk = kChunk;
    if (!dir.empty()) engine_ = Engine::load(dir, opt).release();
  }
  static void TearDownTestSuite() { delete engine_; }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << "models/pycoder-moe not found: set MOESTREAM_SHARED to the shared/ folder";
  }
  static GenerationRequest long_prompt(int n, int max_tokens) {
    std::mt19937 gen{unsigned(n)};
    std::uniform_int_distribution<int> id(1, engine_->model().config().vocab - 1);
    GenerationRequest r;
    for (int i = 0; i < n; ++i) r.prompt.push_back(id(gen));
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  // Prompt tokens the model has run so far, as a session's statistics count them (a chunk's
  // routes are recorded as it ends).
  static uint64_t tokens_run(const EngineStats& stats) {
    for (const LayerUsage& l : stats.snapshot().layers)
      if (l.moe) return l.routed_total / uint64_t(engine_->model().config().top_k);
    return 0;
  }
  // Seconds one chunk's prefill takes (the fastest of three).
  static double chunk_seconds() {
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
      Session s(*engine_);
      const auto t0 = Clock::now();
      s.generate(long_prompt(kChunk, 0));
      best = std::min(best, seconds(Clock::now() - t0));
    }
    return best;
  }
  static Engine* engine_;
};
Engine* PrefillSessionTest::engine_ = nullptr;

TEST_F(PrefillSessionTest, CancelFromAnotherThreadStopsThePrefillWithinAChunk) {
  const double chunk = chunk_seconds();
  const int n = 40 * kChunk;  // some forty chunks: far longer than the wait below
  for (double after : {0.0, 2.5, 6.5}) {  // in chunks' time: before the first chunk ends, and later
    EngineStats stats(engine_->model().config(), {});
    Session s(*engine_, &stats);
    std::atomic<bool> cancel{false};
    GenerationRequest req = long_prompt(n, 8);
    req.cancel = &cancel;
    Clock::time_point cancelled_at;
    uint64_t tokens_at_cancel = 0;
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::duration<double>(after * chunk));
      cancelled_at = Clock::now();
      cancel = true;
      tokens_at_cancel = tokens_run(stats);  // read after the flag: at most the chunk then under way follows
    });
    const GenerationResult r = s.generate(req);
    const auto returned_at = Clock::now();
    canceller.join();
    EXPECT_EQ(r.finish_reason, "cancelled");
    EXPECT_TRUE(r.tokens.empty());
    // The chunk under way when the flag was set finishes; nothing after it runs.
    EXPECT_LE(tokens_run(stats), tokens_at_cancel + kChunk);
    EXPECT_LT(tokens_run(stats), uint64_t(n));
    // A later chunk attends to more positions than the first, whose time `chunk` is.
    const double late = seconds(returned_at - cancelled_at);
    EXPECT_LT(late, 3 * chunk + 0.5) << "returned " << late << " s after the cancel; a first chunk takes " << chunk << " s";
  }
}

TEST_F(PrefillSessionTest, DeadlineStopsThePrefillWithinAChunk) {
  const double chunk = chunk_seconds();
  EngineStats stats(engine_->model().config(), {});
  Session s(*engine_, &stats);
  GenerationRequest req = long_prompt(40 * kChunk, 8);
  req.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(3.5 * chunk));
  uint64_t tokens_at_deadline = 0;
  std::thread reader([&] {
    std::this_thread::sleep_until(req.deadline);
    tokens_at_deadline = tokens_run(stats);
  });
  const GenerationResult r = s.generate(req);
  const double late = seconds(Clock::now() - req.deadline);
  reader.join();
  EXPECT_EQ(r.finish_reason, "timeout");
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_LE(tokens_run(stats), tokens_at_deadline + kChunk);
  EXPECT_LT(late, 3 * chunk + 0.5) << "returned " << late << " s past the deadline; a first chunk takes " << chunk << " s";
}

TEST_F(PrefillSessionTest, IdOutsideTheVocabularyIsRefusedBeforeAnyChunkRuns) {
  Session s(*engine_);
  const GenerationResult first = s.generate(long_prompt(2 * kChunk, 4));
  // The conversation's next turn, once with an id outside the vocabulary in its fifth chunk.
  GenerationRequest next = long_prompt(2 * kChunk, 4);
  next.prompt.insert(next.prompt.end(), first.tokens.begin(), first.tokens.end());
  const GenerationRequest tail = long_prompt(3 * kChunk, 0);
  next.prompt.insert(next.prompt.end(), tail.prompt.begin(), tail.prompt.end());
  GenerationRequest bad = next;
  bad.prompt[4 * kChunk + 3] = engine_->model().config().vocab;
  test::expect_error([&] { s.generate(bad); }, {"token id", std::to_string(4 * kChunk + 3), "outside the vocabulary"});
  // Nothing of it ran: the cache still holds the first turn, which the good next turn reuses.
  const GenerationResult reused = s.generate(next);
  EXPECT_EQ(reused.reused_tokens, 2 * kChunk + int(first.tokens.size()) - 1);
  Session fresh(*engine_);
  EXPECT_EQ(reused.tokens, fresh.generate(next).tokens);
}

TEST_F(PrefillSessionTest, CancelledPrefillLeavesACacheTheNextRequestReuses) {
  const GenerationRequest whole = long_prompt(6 * kChunk + 5, 6);
  Session fresh(*engine_);
  const GenerationResult want = fresh.generate(whole);
  ASSERT_EQ(want.tokens.size(), 6u);

  // Cancelled once two chunks ran: the session keeps the chunks it ran.
  std::atomic<bool> cancel{false};
  GenerationRequest req = whole;
  req.cancel = &cancel;
  EngineStats stats(engine_->model().config(), {});
  Session counted(*engine_, &stats);
  int seen_tokens = 0;
  // The stats see every chunk's routes as it ends: cancel once two chunks went through.
  std::thread watcher([&] {
    while (!cancel) {
      seen_tokens = int(tokens_run(stats));
      if (seen_tokens >= 2 * kChunk) cancel = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  const GenerationResult cut = counted.generate(req);
  watcher.join();
  ASSERT_EQ(cut.finish_reason, "cancelled");
  // The same prompt again: the processed chunks are reused, the answer is the uninterrupted one.
  const GenerationResult resumed = counted.generate(whole);
  EXPECT_GE(resumed.reused_tokens, 2 * kChunk);
  EXPECT_LT(resumed.reused_tokens, int(whole.prompt.size()));
  EXPECT_EQ(resumed.reused_tokens % kChunk, 0);
  EXPECT_EQ(resumed.tokens, want.tokens);
  EXPECT_EQ(resumed.finish_reason, "length");
  // And a different prompt after the cut one starts over, with the answer a fresh session gives.
  const GenerationRequest other = long_prompt(3 * kChunk, 4);
  Session fresh_other(*engine_);
  EXPECT_EQ(counted.generate(other).tokens, fresh_other.generate(other).tokens);
}

}  // namespace
}  // namespace ms
