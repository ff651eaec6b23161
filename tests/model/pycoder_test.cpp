// A trained Qwen3-Next-architecture model (../shared/models/pycoder-moe) against transformers'
// float32 CPU references, and routing against the teacher-forced traces of held-out files.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "backends/load.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "pycoder_fixture.h"
#include "test_support.h"

namespace ms {
namespace {

using test::ints;
using test::max_abs_diff;

using Pycoder = test::PycoderSuite;

TEST_F(Pycoder, Doc5LogitsAndMtpLogitsMatchTransformers) {
  std::vector<int> ids = ints(ref_->get("doc5.input_ids"));
  const int T = int(ids.size());
  State state = model_->new_state();
  ForwardResult r = model_->forward(ids.data(), T, state, {.all_logits = true, .hidden = true});
  const float err = max_abs_diff(r.logits, ref_->get("doc5.logits"));
  std::printf("pycoder doc5: max |logit - reference| = %.3g\n", err);
  EXPECT_LE(err, 1e-3f);
  std::vector<float> m = model_->mtp_forward(r.hidden_pre_norm.data(), ids.data() + 1, T - 1, 0, state);
  const float mtp_err = max_abs_diff(m, ref_->get("doc5.mtp_logits_pre_norm_hidden"));
  std::printf("pycoder doc5: max |mtp logit - reference| = %.3g\n", mtp_err);
  EXPECT_LE(mtp_err, 1e-3f);
}

TEST_F(Pycoder, GreedyContinuationsMatchTransformers) {
  for (const char* p : {"prompt0", "prompt1", "prompt2"}) {
    std::vector<int> want = ints(ref_->get(std::string(p) + ".greedy"));
    State state = model_->new_state();
    std::vector<int> got = generate_greedy(*model_, state, ints(ref_->get(std::string(p) + ".input_ids")),
                                           {.max_tokens = int(want.size()), .stop_at_eos = false});
    EXPECT_EQ(got, want) << p;
  }
}

// Routing against the traces. The traces came from a GPU run (bf16/TF32 arithmetic), which
// routes differently from transformers' own float32 CPU run (that the logits tests above
// match to ~1e-5) wherever experts nearly tie at the top-k boundary: ~3 % of (layer, token)
// sets differ, nearly always by one expert. So the share of routed (layer, token, expert)
// entries that agree must reach 99 %, and the disagreements must be near-ties: the trace's
// expert that we did not pick sits, by median, far closer to our k-th pick (in log
// probability) than the k-th and (k+1)-th experts of a typical token do. The share of
// identical sets is reported. CI checks the first 256
// tokens of each document; MOESTREAM_FULL_TRACES=1 checks every token.
TEST_F(Pycoder, RoutingAgreesWithHeldOutTraces) {
  const bool full = std::getenv("MOESTREAM_FULL_TRACES") != nullptr;
  const ModelConfig& cfg = model_->config();
  const int K = cfg.top_k;
  int64_t same_sets = 0, pairs = 0, same_experts = 0;
  std::vector<double> miss_gaps, boundary_gaps;
  for (int d = 0; routes_->has("doc" + std::to_string(d) + ".tokens"); ++d) {
    const std::string doc = "doc" + std::to_string(d);
    std::vector<int> tokens = ints(routes_->get(doc + ".tokens"));
    const TensorView& trace = routes_->get(doc + ".routes");  // [layers, T_doc, top_k]
    const int T_doc = int(tokens.size());
    const int T = full ? T_doc : std::min(T_doc, 256);
    State state = model_->new_state();
    ForwardResult r = model_->forward(tokens.data(), T, state, {.routes = true});
    for (int l = 0; l < cfg.n_layers; ++l)
      for (int t = 0; t < T; ++t) {
        const int* got = r.routes[size_t(l)].data() + size_t(t) * size_t(K);
        const int16_t* want = trace.as<int16_t>() + (size_t(l) * size_t(T_doc) + size_t(t)) * size_t(K);
        const std::set<int> ours(got, got + K), theirs(want, want + K);
        ++pairs;
        same_sets += ours == theirs;
        for (int k = 0; k < K; ++k) same_experts += theirs.count(got[k]);
        const float* p = r.router_probs[size_t(l)].data() + size_t(t) * size_t(cfg.n_experts);
        std::vector<float> sorted(p, p + cfg.n_experts);
        std::nth_element(sorted.begin(), sorted.begin() + K, sorted.end(), std::greater<float>());
        boundary_gaps.push_back(std::log(p[got[K - 1]]) - std::log(sorted[size_t(K)]));
        for (int k = 0; k < K; ++k)
          if (!ours.count(want[k])) miss_gaps.push_back(std::log(p[got[K - 1]]) - std::log(p[want[k]]));
      }
  }
  const double expert_share = double(same_experts) / double(pairs * K);
  std::printf("pycoder routing vs traces%s: identical sets %.4f of %lld (layer, token) pairs, routed experts %.4f\n",
              full ? "" : " (first 256 tokens per document)", double(same_sets) / double(pairs), (long long)pairs,
              expert_share);
  EXPECT_GE(expert_share, 0.99);
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double miss_gap = median(miss_gaps), boundary_gap = median(boundary_gaps);
  std::printf("disagreements: median log-prob gap to our k-th pick %.4f; typical k-th to (k+1)-th gap %.4f\n", miss_gap,
              boundary_gap);
  EXPECT_LT(miss_gap, 0.25 * boundary_gap) << "disagreements are not near-ties";
}

}  // namespace
}  // namespace ms
