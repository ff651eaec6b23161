// MTP self-speculative decoding (runtime/speculative.h): greedy output token for token the plain
// decoder's, for every draft depth and auto, resident and streamed; sampled output with the
// sampler's distribution (chi-square against the exact distribution, and the same test failing
// when the acceptance rule is broken); the state after a speculative run that of a plain one; a
// model without an MTP head refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "backends/load.h"
#include "kernels/cpu/sample.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "runtime/speculative.h"
#include "test_support.h"

namespace ms {
namespace {

using test::ints;

const std::string kQ4 = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";

struct GreedyCase {
  std::string dir;
  int slots = 0;
  std::vector<std::vector<int>> prompts;
  int tokens = 0;
};

// The reference prompts of a model directory's reference.safetensors ("<name>.input_ids").
std::vector<std::vector<int>> reference_prompts(const std::string& ref_file, const std::vector<std::string>& names) {
  TensorStore ref = TensorStore::open(ref_file);
  std::vector<std::vector<int>> out;
  for (const auto& n : names) out.push_back(ints(ref.get(n + ".input_ids")));
  return out;
}

std::vector<GreedyCase> greedy_cases() {
  std::vector<GreedyCase> out;
  if (std::string d = test::shared_path("fixtures/qwen3-next-tiny"); !d.empty())
    out.push_back({d, 0, reference_prompts(d + "/reference.safetensors", {"p0", "p1", "p2"}), 24});
  if (std::string d = test::shared_path("models/pycoder-moe"); !d.empty()) {
    const auto prompts = reference_prompts(d + "/reference.safetensors", {"prompt0", "prompt1", "prompt2"});
    out.push_back({d, 0, prompts, 48});
    out.push_back({kQ4, 0, prompts, 48});
    out.push_back({kQ4, 16, prompts, 48});
  }
  return out;
}

std::unique_ptr<Model> open_model(const std::string& dir, int slots = 0) {
  ModelOptions opt;
  opt.experts.slots = slots;
  return load_model(dir, opt);
}

std::vector<int> greedy(const Model& m, const std::vector<int>& prompt, int n, SpeculativeOptions spec = {},
                        SpeculativeStats* stats = nullptr) {
  State s = m.new_state();
  return generate_greedy(m, s, prompt, {.max_tokens = n, .stop_at_eos = false, .speculative = spec, .speculative_stats = stats});
}

TEST(Speculative, GreedyWithMtpIsPlainGreedy) {
  const auto cases = greedy_cases();
  if (cases.empty()) GTEST_SKIP() << "../shared not found: set MOESTREAM_SHARED to the shared/ folder";
  for (const GreedyCase& c : cases) {
    auto model = open_model(c.dir, c.slots);
    SpeculativeStats all;
    for (const auto& prompt : c.prompts) {
      const std::vector<int> plain = greedy(*model, prompt, c.tokens);
      for (int K : {1, 2, 3, kDraftAuto}) {
        SpeculativeStats st;
        EXPECT_EQ(greedy(*model, prompt, c.tokens, {.mtp = true, .draft = K}, &st), plain)
            << c.dir << " slots " << c.slots << " K " << K;
        all.add(st);
      }
    }
    EXPECT_GT(all.verifies, 0u) << c.dir;
    std::printf("%s slots %d: %.3f of %llu drafts accepted, %.2f tokens per forward\n", c.dir.c_str(), c.slots,
                all.acceptance(), (unsigned long long)all.drafted, all.tokens_per_forward());
  }
}

// A longer run, where auto has time to settle, and the trained head's drafts are mostly kept.
TEST(Speculative, LongGreedyRunIsPlainGreedy) {
  const std::string d = test::shared_path("models/pycoder-moe");
  if (d.empty()) GTEST_SKIP() << "models/pycoder-moe not found: set MOESTREAM_SHARED to the shared/ folder";
  const std::vector<int> prompt = reference_prompts(d + "/reference.safetensors", {"prompt1"})[0];
  for (auto [dir, slots] : std::vector<std::pair<std::string, int>>{{d, 0}, {kQ4, 0}, {kQ4, 16}}) {
    auto model = open_model(dir, slots);
    const std::vector<int> plain = greedy(*model, prompt, 256);
    for (int K : {3, kDraftAuto}) {
      SpeculativeStats st;
      EXPECT_EQ(greedy(*model, prompt, 256, {.mtp = true, .draft = K}, &st), plain) << dir << " slots " << slots << " K " << K;
      if (K == 3) {
        EXPECT_GT(st.acceptance(), 0.4) << dir << " slots " << slots;
      }
    }
  }
}

// After a speculative run the state is a plain run's: the next step's logits are bit-identical.
TEST(Speculative, StateAfterASpeculativeRunIsAPlainRunsState) {
  auto model = open_model(kQ4, 16);
  const std::vector<int> prompt = {563, 279, 1002, 14, 220, 9, 87};
  State c = model->new_state();  // plain one-token steps
  const std::vector<int> plain = generate_greedy(*model, c, prompt, {.max_tokens = 37, .stop_at_eos = false});
  const ForwardResult rc = model->forward(&plain.back(), 1, c, {});
  for (int K : {1, 2, 3, kDraftAuto}) {
    State a = model->new_state();
    const std::vector<int> out =
        generate_greedy(*model, a, prompt, {.max_tokens = 37, .stop_at_eos = false, .speculative = {.mtp = true, .draft = K}});
    ASSERT_EQ(out, plain) << "K " << K;
    ASSERT_EQ(a.position(), c.position() - 1) << "K " << K;  // every token processed but the last
    const ForwardResult ra = model->forward(&out.back(), 1, a, {});
    ASSERT_EQ(ra.logits.size(), rc.logits.size());
    EXPECT_EQ(std::memcmp(ra.logits.data(), rc.logits.data(), ra.logits.size() * sizeof(float)), 0) << "K " << K;
  }
}

TEST(Speculative, ModelWithoutAnMtpHeadIsRefusedOrRunsPlain) {
  const std::string d = test::shared_path("fixtures/qwen3-moe-tiny");
  if (d.empty()) GTEST_SKIP() << "fixtures/qwen3-moe-tiny not found: set MOESTREAM_SHARED to the shared/ folder";
  auto model = load_model(d);
  test::expect_error([&] { resolve_speculative(*model, {.mtp = true}, d); }, {d, "--speculative mtp needs an MTP head"});
  const SpeculativeOptions automatic = resolve_speculative(*model, {.automatic = true}, d);
  EXPECT_FALSE(automatic.mtp);
  auto q4 = open_model(kQ4);
  EXPECT_TRUE(resolve_speculative(*q4, {.automatic = true}, kQ4).mtp);
  test::expect_error([&] { resolve_speculative(*q4, {.mtp = true, .draft = kMaxDraft + 1}, kQ4); }, {"--draft must be 1 to"});
}

// ---- sampling ------------------------------------------------------------------------------

// The chi-square statistic of `counts` (n draws) against the probabilities `want`, cells with
// fewer than 5 expected draws pooled into one; its degrees of freedom in *df.
double chi_square(const std::map<std::vector<int>, int>& counts, const std::map<std::vector<int>, double>& want, int n,
                  int* df) {
  double stat = 0, pooled_expected = 0, pooled_seen = 0;
  int cells = 0;
  for (const auto& [key, p] : want) {
    const double e = p * n;
    const auto it = counts.find(key);
    const double o = it == counts.end() ? 0 : it->second;
    if (e < 5) {
      pooled_expected += e;
      pooled_seen += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  int outside = 0;  // draws of keys with no probability at all: impossible under `want`
  for (const auto& [key, o] : counts)
    if (!want.count(key)) outside += o;
  pooled_seen += outside;
  if (pooled_expected > 0 || pooled_seen > 0) {
    stat += (pooled_seen - pooled_expected) * (pooled_seen - pooled_expected) / std::max(pooled_expected, 1.0);
    ++cells;
  }
  *df = cells - 1;
  return stat;
}

// The chi-square quantile at 1 - 1e-3 (Wilson-Hilferty): a correct sampler fails one run in a thousand.
double chi_square_critical(int df) {
  const double z = 3.090, k = df;
  const double t = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * t * t * t;
}

const SamplingParams kSampling{.temperature = 1.0f, .top_k = 5};

cpu::Distribution target(const Model& m, const std::vector<int>& ids, const SamplingParams& sp = kSampling) {
  State s = m.new_state();
  const ForwardResult r = m.forward(ids.data(), int(ids.size()), s, {});
  Sampler sampler(sp);
  cpu::SampleScratch scratch;
  cpu::Distribution d;
  cpu::distribution(r.logits.data(), m.config().vocab, sampler.inputs({}, m.config().vocab), scratch, d);
  return d;
}

// The exact distribution of the first `depth` sampled tokens after `prompt`, by enumeration.
void exact_joint(const Model& m, std::vector<int> prefix, int depth, double p, std::vector<int> key,
                 std::map<std::vector<int>, double>& out) {
  if (depth == 0) {
    out[key] += p;
    return;
  }
  const cpu::Distribution d = target(m, prefix);
  for (size_t i = 0; i < d.ids.size(); ++i) {
    prefix.push_back(d.ids[i]);
    key.push_back(d.ids[i]);
    exact_joint(m, prefix, depth - 1, p * d.probs[i], key, out);
    prefix.pop_back();
    key.pop_back();
  }
}

// The first three sampled tokens over many seeds, with MTP drafts (two per verify: the second
// and third tokens come from one verify, kept or resampled), against the exact distribution.
TEST(SpeculativeSampling, FirstTokensFollowTheSamplersDistribution) {
  auto engine = Engine::load(kQ4);
  const Model& m = engine->model();
  const std::vector<int> prompt = {563, 279, 1002, 14, 220};
  std::map<std::vector<int>, double> want;
  exact_joint(m, prompt, 3, 1.0, {}, want);
  const int n = 2000;
  std::map<std::vector<int>, int> got;
  Session session(*engine);
  SpeculativeStats spec;
  for (int seed = 0; seed < n; ++seed) {
    GenerationRequest req{.prompt = prompt, .max_tokens = 3, .ignore_eos = true};
    req.sampling = kSampling;
    req.sampling.seed = uint64_t(seed);
    req.speculative = SpeculativeOptions{.mtp = true, .draft = 2};
    const GenerationResult r = session.generate(req);
    spec.add(r.speculative);
    ++got[r.tokens];
  }
  int df = 0;
  const double stat = chi_square(got, want, n, &df);
  std::printf("speculative sampling: chi-square %.1f, %d degrees of freedom, critical %.1f; %.3f of drafts kept\n", stat, df,
              chi_square_critical(df), spec.acceptance());
  EXPECT_LT(stat, chi_square_critical(df));
  // Both branches ran: drafts kept and drafts rejected.
  EXPECT_GT(spec.accepted, 0u);
  EXPECT_LT(spec.accepted, spec.drafted);
}

// The acceptance rule alone, on two real distributions p (the target) and q (the draft's: the
// same logits at twice the temperature): tokens it gives follow p; a broken rule's (keep every
// draft, or resample from p rather than from the residual) fail the same test.
TEST(SpeculativeSampling, ChiSquareCatchesABrokenAcceptanceRule) {
  auto model = open_model(kQ4);
  const cpu::Distribution p = target(*model, {563, 279, 1002, 14, 220});
  SamplingParams flatter = kSampling;
  flatter.temperature = 2.0f;
  const cpu::Distribution q = target(*model, {563, 279, 1002, 14, 220}, flatter);
  std::map<std::vector<int>, double> want;
  for (size_t i = 0; i < p.ids.size(); ++i) want[{p.ids[i]}] = p.probs[i];
  std::mt19937_64 rng(7);
  auto uniform = [&] { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); };
  const int n = 4000;
  auto run = [&](int rule) {
    std::map<std::vector<int>, int> got;
    for (int i = 0; i < n; ++i) {
      const int d = draw(q, uniform());
      bool kept = false;
      int token = speculative_pick(p, q, d, uniform, &kept);
      if (rule == 1) token = d;                            // broken: every draft kept
      if (rule == 2 && !kept) token = draw(p, uniform());  // broken: a rejection resampled from p
      ++got[{token}];
    }
    int df = 0;
    const double stat = chi_square(got, want, n, &df);
    return stat / chi_square_critical(df);
  };
  EXPECT_LT(run(0), 1.0);
  EXPECT_GT(run(1), 1.0) << "keeping every draft went unnoticed";
  EXPECT_GT(run(2), 1.0) << "resampling from p went unnoticed";
}

}  // namespace
}  // namespace ms
