#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <map>

#include "util/error.h"

namespace ms {
namespace {

TEST(Sampler, GreedyPicksArgmax) {
  Sampler s({});
  const float logits[] = {0.1f, 2.f, -1.f, 1.9f};
  EXPECT_EQ(s.sample(logits, 4, {}), 1);
}

TEST(Sampler, SameSeedSameOutput) {
  const float logits[] = {1.f, 1.1f, 0.9f, 1.05f, 0.5f};
  SamplingParams p{.temperature = 1.f, .seed = 42};
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits, 5, {}), b.sample(logits, 5, {}));
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  const float logits[] = {0.f, std::log(2.f), std::log(3.f)};  // probabilities 1/6, 2/6, 3/6
  Sampler s({.temperature = 1.f, .seed = 7});
  std::map<int, int> n;
  const int draws = 60000;
  for (int i = 0; i < draws; ++i) ++n[s.sample(logits, 3, {})];
  EXPECT_NEAR(n[0] / double(draws), 1 / 6.0, 0.01);
  EXPECT_NEAR(n[1] / double(draws), 2 / 6.0, 0.01);
  EXPECT_NEAR(n[2] / double(draws), 3 / 6.0, 0.01);
}

TEST(Sampler, TopKTopPMinPRestrictTheCandidates) {
  const float logits[] = {5.f, 4.f, 3.f, 0.f, -1.f};
  for (auto p : {SamplingParams{.temperature = 1.f, .top_k = 2}, SamplingParams{.temperature = 1.f, .top_p = 0.5f},
                 SamplingParams{.temperature = 1.f, .min_p = 0.3f}}) {
    Sampler s(p);
    for (int i = 0; i < 500; ++i) {
      const int t = s.sample(logits, 5, {});
      EXPECT_LE(t, 1);  // top_p 0.5: p(0) ≈ 0.66 alone suffices; min_p 0.3 keeps 0 and 1 (0.37)
      if (p.top_p < 1.f) {
        EXPECT_EQ(t, 0);
      }
    }
  }
}

TEST(Sampler, PenaltiesDiscourageSeenTokens) {
  const float logits[] = {2.f, 1.9f};
  Sampler rep({.repetition_penalty = 1.5f});
  EXPECT_EQ(rep.sample(logits, 2, {0}), 1);  // 2/1.5 < 1.9
  Sampler pres({.presence_penalty = 0.5f});
  EXPECT_EQ(pres.sample(logits, 2, {0}), 1);
  Sampler freq({.frequency_penalty = 0.06f});
  EXPECT_EQ(freq.sample(logits, 2, {0}), 0);     // one occurrence: 1.94 > 1.9
  EXPECT_EQ(freq.sample(logits, 2, {0, 0}), 1);  // two: 1.88 < 1.9
}

TEST(Sampler, OutOfRangeParametersAreNamed) {
  try {
    Sampler s({.top_p = 0.f});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  EXPECT_THROW(Sampler({.temperature = -1.f}), Error);
  EXPECT_THROW(Sampler({.min_p = 2.f}), Error);
}

}  // namespace
}  // namespace ms
