// The one decode loop (runtime/decoder.h) on the embedded pycoder model: greedy steps are the
// step-by-step forward's first maxima, on_token stops it, and the state advances by the steps.
#include "runtime/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "backends/load.h"

namespace ms {
namespace {

int argmax(const std::vector<float>& l) { return int(std::max_element(l.begin(), l.end()) - l.begin()); }

class DecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
    if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
    model_ = load_model(dir);
    for (int i = 0; i < 12; ++i) prompt_.push_back((i * 7919 + 13) % model_->config().vocab);
  }
  // The prompt through a fresh state; the first token after it.
  int prefill(State& s) const { return argmax(model_->forward(prompt_.data(), int(prompt_.size()), s).logits); }

  std::unique_ptr<Model> model_;
  std::vector<int> prompt_;
};

TEST_F(DecoderTest, GreedyStepsAreStepByStepForwards) {
  State a = model_->new_state(), b = model_->new_state();
  const int first = prefill(a);
  ASSERT_EQ(prefill(b), first);
  std::vector<int> want;
  for (int t = first; want.size() < 20;) want.push_back(t = argmax(model_->forward(&t, 1, b).logits));

  Sampler greedy({});
  std::vector<int> got;
  const int steps = Decoder(*model_).run(a, first, 20, greedy, {}, [&](const ForwardResult& r) {
    got.push_back(r.token);
    return true;
  });
  EXPECT_EQ(steps, 20);
  EXPECT_EQ(got, want);
  EXPECT_EQ(a.position(), b.position());
}

TEST_F(DecoderTest, OnTokenStopsItAndTheStateCountsTheStepsRun) {
  State s = model_->new_state();
  const int first = prefill(s), start = s.position();
  Sampler sampler({.temperature = 0.8f, .seed = 5});
  std::vector<int> got;
  const int steps = Decoder(*model_, true).run(s, first, 50, sampler, {}, [&](const ForwardResult& r) {
    EXPECT_FALSE(r.routes.empty()) << "routes were asked for";
    got.push_back(r.token);
    return got.size() < 7;
  });
  EXPECT_EQ(got.size(), 7u);
  EXPECT_EQ(steps, 7);  // the CPU runs no step ahead of the one refused
  EXPECT_EQ(s.position(), start + steps);
  EXPECT_EQ(Decoder(*model_).run(s, first, 0, sampler, {}, [](const ForwardResult&) { return true; }), 0);
}

}  // namespace
}  // namespace ms
