// The forward pass against what Hugging Face transformers computes for the fixtures
// (../shared/fixtures/*/reference.safetensors): logits of every position, the routed expert
// set of every token at every layer, and the greedy continuation through cached decode.
#include <gtest/gtest.h>

#include <cstdio>
#include <cmath>

#include "backends/load.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_support.h"

namespace ms {
namespace {

using test::ints;
using test::max_abs_diff;

using Case = test::FixtureCase;

class FixtureReference : public ::testing::TestWithParam<Case> {};

TEST_P(FixtureReference, LogitsRoutesAndGreedyMatchTransformers) {
  const Case c = GetParam();
  MS_REQUIRE_SHARED(std::string("fixtures/") + c.fixture, dir);
  auto model = load_model(dir);
  TensorStore ref = TensorStore::open(dir + "/reference.safetensors");
  const std::string p = c.prompt;
  std::vector<int> ids = ints(ref.get(p + ".input_ids"));
  const int T = int(ids.size());
  const ModelConfig& cfg = model->config();

  State state = model->new_state();
  ForwardResult r = model->forward(ids.data(), T, state, {.all_logits = true, .hidden = true, .routes = true});
  const float logit_err = max_abs_diff(r.logits, ref.get(p + ".logits"));
  std::printf("%s %s: max |logit - reference| = %.3g\n", c.fixture, c.prompt, logit_err);
  EXPECT_LE(logit_err, 1e-3f);
  EXPECT_LE(max_abs_diff(r.hidden_pre_norm, ref.get(p + ".hidden_pre_final_norm")), 1e-3f);
  EXPECT_LE(max_abs_diff(r.hidden_post_norm, ref.get(p + ".hidden_post_final_norm")), 1e-3f);

  EXPECT_EQ(test::mismatched_route_sets(r.routes, ref, p, cfg), 0) << "(layer, token) pairs whose routed expert set differs";

  if (model->has_mtp()) {
    for (const char* variant : {"pre", "post"}) {
      const auto& h = std::string(variant) == "pre" ? r.hidden_pre_norm : r.hidden_post_norm;
      State s = model->new_state();
      std::vector<float> m = model->mtp_forward(h.data(), ids.data() + 1, T - 1, 0, s);
      const float mtp_err = max_abs_diff(m, ref.get(p + ".mtp_logits_" + variant + "_norm_hidden"));
      std::printf("%s %s: max |mtp logit - reference| (%s-norm hidden) = %.3g\n", c.fixture, c.prompt, variant, mtp_err);
      EXPECT_LE(mtp_err, 1e-3f) << variant;
    }
  }

  std::vector<int> want = ints(ref.get(p + ".greedy"));
  State gen_state = model->new_state();
  std::vector<int> got = generate_greedy(*model, gen_state, ids, {.max_tokens = int(want.size()), .stop_at_eos = false});
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureReference,
                         ::testing::ValuesIn(test::fixture_cases()),
                         [](const auto& info) { return test::fixture_case_name(info.param); });

}  // namespace
}  // namespace ms
