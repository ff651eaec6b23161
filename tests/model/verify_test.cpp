// Speculative verification (ForwardOptions::verify): each of T rows gets the bits a one-token
// decode step gives it, and State::keep_steps rolls a rejected suffix back so exactly that the next
// step's logits are those of a plain run at the same position. On a Qwen3-Next checkpoint, on
// pycoder-moe and on its streamed 4-bit engine directory, all experts resident and 16 slots a layer.
#include <gtest/gtest.h>

#include <cstring>

#include "backends/load.h"
#include "model/model.h"
#include "test_support.h"

namespace ms {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  std::string dir;
  int slots = 0;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* rel : {"fixtures/qwen3-next-tiny", "models/pycoder-moe"})
    if (std::string d = test::shared_path(rel); !d.empty()) out.push_back({d, 0});
  const std::string q4 = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
  out.push_back({q4, 0});
  out.push_back({q4, 16});
  return out;
}

std::unique_ptr<Model> open(const Case& c) {
  ModelOptions opt;
  opt.experts.slots = c.slots;
  return load_model(c.dir, opt);
}

const std::vector<int> kPrompt = {11, 402, 93, 7, 1000, 56, 300, 21, 640, 5};
const std::vector<int> kNext = {77, 512, 9, 130};  // what the verified rows carry

// Row i of a verify forward of kNext equals the logits of a one-token step over kNext[i].
TEST(VerifyForward, EveryRowHasTheBitsOfAOneTokenStep) {
  for (const Case& c : cases()) {
    auto model = open(c);
    State a = model->new_state(), b = model->new_state();
    model->forward(kPrompt.data(), int(kPrompt.size()), a, {.logits = false});
    model->forward(kPrompt.data(), int(kPrompt.size()), b, {.logits = false});
    const int T = int(kNext.size()), vocab = model->config().vocab;
    const ForwardResult v = model->forward(kNext.data(), T, a, {.all_logits = true, .hidden = true, .verify = true});
    ASSERT_EQ(v.logits.size(), size_t(T) * size_t(vocab));
    for (int t = 0; t < T; ++t) {
      const ForwardResult one = model->forward(&kNext[size_t(t)], 1, b, {.hidden = true});
      const std::vector<float> row(v.logits.begin() + ptrdiff_t(t) * vocab, v.logits.begin() + ptrdiff_t(t + 1) * vocab);
      EXPECT_TRUE(same_bits(row, one.logits)) << c.dir << " slots " << c.slots << ": row " << t;
      const size_t H = size_t(model->config().hidden);
      const std::vector<float> h(v.hidden_pre_norm.begin() + ptrdiff_t(size_t(t) * H),
                                 v.hidden_pre_norm.begin() + ptrdiff_t(size_t(t + 1) * H));
      EXPECT_TRUE(same_bits(h, one.hidden_pre_norm)) << c.dir << " slots " << c.slots << ": hidden row " << t;
    }
  }
}

// After a verify forward keeps n of its T tokens, the next token's logits are those of a plain
// run that processed the same n tokens: the linear-attention states and the position rolled back.
TEST(VerifyForward, KeptStepsContinueAsAPlainRun) {
  for (const Case& c : cases()) {
    auto model = open(c);
    const int T = int(kNext.size());
    for (int n = 1; n <= T; ++n) {
      State a = model->new_state(), b = model->new_state();
      model->forward(kPrompt.data(), int(kPrompt.size()), a, {.logits = false});
      model->forward(kPrompt.data(), int(kPrompt.size()), b, {.logits = false});
      model->forward(kNext.data(), T, a, {.all_logits = true, .verify = true});
      a.keep_steps(n);
      EXPECT_EQ(a.position(), int(kPrompt.size()) + n);
      for (int t = 0; t < n; ++t) model->forward(&kNext[size_t(t)], 1, b, {});
      const int after = 4000 % model->config().vocab;
      const ForwardResult ra = model->forward(&after, 1, a, {}), rb = model->forward(&after, 1, b, {});
      EXPECT_TRUE(same_bits(ra.logits, rb.logits)) << c.dir << " slots " << c.slots << ": kept " << n << " of " << T;
    }
  }
}

TEST(VerifyForward, KeepingMoreThanWasVerifiedIsRefused) {
  auto model = open(cases().back());
  State s = model->new_state();
  model->forward(kPrompt.data(), int(kPrompt.size()), s, {.logits = false});
  model->forward(kNext.data(), 2, s, {.verify = true});
  test::expect_error([&] { s.keep_steps(3); }, {"keep_steps: 3 of 2 verified tokens"});
  s.keep_steps(1);
  test::expect_error([&] { s.keep_steps(1); }, {"not right after the verified tokens"});
}

}  // namespace
}  // namespace ms
