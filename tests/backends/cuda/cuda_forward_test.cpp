// The forward on the GPU (--device cuda) against the transformers reference of the fixtures:
// logits of every position within 5e-3, the same routed expert sets, the same greedy tokens,
// and the MTP head's logits. Built with the CUDA backend; skipped where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "kernels/cuda/device.h"
#include "backends/cuda/cuda_executor.h"
#include "backends/load.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "writers/convert.h"
#include "test_support.h"

namespace ms {
namespace {

using test::ints;
using test::max_abs_diff;

constexpr float kTol = 5e-3f;

ModelOptions on_gpu() {
  ModelOptions o;
  o.device = Device::Cuda;
  return o;
}

using Case = test::FixtureCase;

class CudaForward : public ::testing::TestWithParam<Case> {};

TEST_P(CudaForward, MatchesTransformersOnTheGpu) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  MS_REQUIRE_SHARED(std::string("fixtures/") + c.fixture, dir);
  auto model = load_model(dir, on_gpu());
  ASSERT_EQ(model->device(), Device::Cuda);
  TensorStore ref = TensorStore::open(dir + "/reference.safetensors");
  const std::string p = c.prompt;
  std::vector<int> ids = ints(ref.get(p + ".input_ids"));
  const int T = int(ids.size());
  const ModelConfig& cfg = model->config();

  State state = model->new_state();
  ForwardResult r = model->forward(ids.data(), T, state, {.all_logits = true, .hidden = true, .routes = true});
  const float logit_err = max_abs_diff(r.logits, ref.get(p + ".logits"));
  std::printf("cuda %s %s: max |logit - reference| = %.3g\n", c.fixture, c.prompt, logit_err);
  EXPECT_LE(logit_err, kTol);

  EXPECT_EQ(test::mismatched_route_sets(r.routes, ref, p, cfg), 0) << "(layer, token) pairs whose routed expert set differs";

  if (model->has_mtp()) {
    State s = model->new_state();
    std::vector<float> m = model->mtp_forward(r.hidden_pre_norm.data(), ids.data() + 1, T - 1, 0, s);
    const float mtp_err = max_abs_diff(m, ref.get(p + ".mtp_logits_pre_norm_hidden"));
    std::printf("cuda %s %s: max |mtp logit - reference| = %.3g\n", c.fixture, c.prompt, mtp_err);
    EXPECT_LE(mtp_err, kTol);
  }

  std::vector<int> want = ints(ref.get(p + ".greedy"));
  State gen_state = model->new_state();
  std::vector<int> got = generate_greedy(*model, gen_state, ids, {.max_tokens = int(want.size()), .stop_at_eos = false});
  EXPECT_EQ(got, want);
}

// A checkpoint taken on the GPU restores the device's linear-attention states: decoding again
// from it gives the same logits.
TEST(CudaForward, CheckpointRestoresDeviceState) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", dir);
  auto model = load_model(dir, on_gpu());
  State s = model->new_state();
  const std::vector<int> prompt = {1, 17, 42, 99, 5};
  model->forward(prompt.data(), int(prompt.size()), s);
  const State::Checkpoint c = s.checkpoint();
  const int next[2] = {7, 8};
  const std::vector<float> first = model->forward(next, 2, s).logits;
  s.restore(c);
  EXPECT_EQ(model->forward(next, 2, s).logits, first);
}

// The embedded pycoder-moe-q4 (Qwen3-Next, 4-bit affine, an engine directory with an MTP head)
// on the GPU against the CPU path, which the fixtures and pycoder_test tie to transformers.
TEST(CudaForward, PycoderQ4MatchesTheCpu) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
  auto cpu = load_model(dir), gpu = load_model(dir, on_gpu());
  std::vector<int> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 7919 + 13) % cpu->config().vocab);
  const int T = int(ids.size());
  State sc = cpu->new_state(), sg = gpu->new_state();
  const ForwardOptions all{.all_logits = true, .hidden = true, .routes = true};
  ForwardResult rc = cpu->forward(ids.data(), T, sc, all), rg = gpu->forward(ids.data(), T, sg, all);
  float err = 0.f;
  for (size_t i = 0; i < rc.logits.size(); ++i) err = std::max(err, std::abs(rc.logits[i] - rg.logits[i]));
  std::printf("cuda pycoder-moe-q4: max |gpu logit - cpu logit| = %.3g\n", err);
  EXPECT_LE(err, kTol);
  int mismatched = 0;
  for (size_t l = 0; l < rc.routes.size(); ++l)
    for (int t = 0; t < T; ++t) {
      const int K = cpu->config().top_k;
      const int* a = rc.routes[l].data() + size_t(t) * size_t(K);
      const int* b = rg.routes[l].data() + size_t(t) * size_t(K);
      if (std::set<int>(a, a + K) != std::set<int>(b, b + K)) ++mismatched;
    }
  EXPECT_EQ(mismatched, 0);
  State mc = cpu->new_state(), mg = gpu->new_state();
  const std::vector<float> mtp_c = cpu->mtp_forward(rc.hidden_pre_norm.data(), ids.data() + 1, T - 1, 0, mc);
  const std::vector<float> mtp_g = gpu->mtp_forward(rc.hidden_pre_norm.data(), ids.data() + 1, T - 1, 0, mg);
  float mtp_err = 0.f;
  for (size_t i = 0; i < mtp_c.size(); ++i) mtp_err = std::max(mtp_err, std::abs(mtp_c[i] - mtp_g[i]));
  std::printf("cuda pycoder-moe-q4: max |gpu mtp logit - cpu mtp logit| = %.3g\n", mtp_err);
  EXPECT_LE(mtp_err, kTol);
  State gc = cpu->new_state(), gg = gpu->new_state();
  const GenerateOptions gen{.max_tokens = 48, .stop_at_eos = false};
  EXPECT_EQ(generate_greedy(*gpu, gg, ids, gen), generate_greedy(*cpu, gc, ids, gen));
}

// GGUF imports (4-, 5- and 8-bit groups of 32 with f16 scales: Q4_0 and Q8_0 on the tensor
// cores, Q5_0 on the float kernel; float32 routers and shared expert gates) on the GPU against
// the CPU path on the same engine directory: every logit of a prompt within kTol, and the same
// greedy tokens. The files are made as import_gguf_test's, from the fixtures' checkpoints with
// gguf-py; a fixture ../shared lacks is left out.
TEST(CudaForward, GgufImportsMatchTheCpu) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  int ran = 0;
  for (const char* fixture : {"qwen3-next-tiny", "qwen3-moe-tiny"})
    for (const char* type : {"Q4_0", "Q5_0", "Q8_0"}) {
      const std::string what = std::string(fixture) + " " + type;
      const std::string hf = test::shared_path(std::string("fixtures/") + fixture);
      const std::string dir = test::scratch_dir(std::string("cuda-gguf-") + fixture + type);
      if (hf.empty() || !test::make_gguf("model " + hf + " " + dir + "/m.gguf " + type + " " + dir + "/ref")) continue;
      ++ran;
      ConvertOptions opt;
      opt.from = dir + "/m.gguf";
      opt.out = dir + "/engine";
      convert_checkpoint(opt);
      auto cpu = load_model(opt.out), gpu = load_model(opt.out, on_gpu());
      std::vector<int> ids;
      for (int i = 0; i < 24; ++i) ids.push_back((i * 7919 + 13) % cpu->config().vocab);
      State sc = cpu->new_state(), sg = gpu->new_state();
      const ForwardOptions all{.all_logits = true};
      const std::vector<float> lc = cpu->forward(ids.data(), int(ids.size()), sc, all).logits;
      const std::vector<float> lg = gpu->forward(ids.data(), int(ids.size()), sg, all).logits;
      ASSERT_EQ(lc.size(), lg.size()) << what;
      float err = 0.f;
      for (size_t i = 0; i < lc.size(); ++i) err = std::max(err, std::abs(lc[i] - lg[i]));
      std::printf("cuda %s: max |gpu logit - cpu logit| = %.3g\n", what.c_str(), err);
      EXPECT_LE(err, kTol) << what;
      State gc = cpu->new_state(), gg = gpu->new_state();
      const GenerateOptions gen{.max_tokens = 24, .stop_at_eos = false};
      EXPECT_EQ(generate_greedy(*gpu, gg, ids, gen), generate_greedy(*cpu, gc, ids, gen)) << what;
    }
  if (ran == 0) GTEST_SKIP() << "../shared absent: no fixture to make a GGUF of";
}

// Decode steps of an engine directory route on the GPU (CudaBackend::moe_decode) and hand the routes and
// router probabilities back at the end of the forward: the same sets as the CPU's, every layer.
TEST(CudaForward, PycoderQ4DecodeRoutesMatchTheCpu) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
  auto cpu = load_model(dir), gpu = load_model(dir, on_gpu());
  const int K = cpu->config().top_k, E = cpu->config().n_experts;
  State sc = cpu->new_state(), sg = gpu->new_state();
  int mismatched = 0;
  float prob_err = 0.f;
  for (int t = 0; t < 24; ++t) {
    const int id = (t * 7919 + 13) % cpu->config().vocab;
    const ForwardOptions routes{.routes = true};
    const ForwardResult rc = cpu->forward(&id, 1, sc, routes), rg = gpu->forward(&id, 1, sg, routes);
    for (size_t l = 0; l < rc.routes.size(); ++l) {
      if (rc.routes[l].empty()) continue;
      ASSERT_EQ(rg.routes[l].size(), size_t(K));
      ASSERT_EQ(rg.router_probs[l].size(), size_t(E));
      if (std::set<int>(rc.routes[l].begin(), rc.routes[l].end()) != std::set<int>(rg.routes[l].begin(), rg.routes[l].end()))
        ++mismatched;
      for (int e = 0; e < E; ++e)
        prob_err = std::max(prob_err, std::abs(rg.router_probs[l][size_t(e)] - rc.router_probs[l][size_t(e)]));
    }
  }
  EXPECT_EQ(mismatched, 0) << "(layer, step) pairs whose routed expert set differs";
  EXPECT_LE(prob_err, 1e-4f);
}

// Decode steps replayed as the sequence's CUDA graph give the eager steps' logits and hidden
// states bit for bit: over enough steps that the KV caches outgrow the first capture's room (a
// second capture), and again after a checkpoint moves the position back.
void check_captured_steps_match_eager(const std::string& dir, int steps) {
  ModelOptions eager_opt = on_gpu();
  eager_opt.cuda_graphs = false;
  auto graphs = load_model(dir, on_gpu()), eager = load_model(dir, eager_opt);
  ASSERT_TRUE(decode_graphs(*graphs)) << dir << ": every expert is resident, so decode steps should be captured";
  ASSERT_FALSE(decode_graphs(*eager));
  const int vocab = graphs->config().vocab;
  State sg = graphs->new_state(), se = eager->new_state();
  const std::vector<int> prompt = {1, 17, 42, 99, 5};
  graphs->forward(prompt.data(), int(prompt.size()), sg);
  eager->forward(prompt.data(), int(prompt.size()), se);
  const State::Checkpoint cg = sg.checkpoint(), ce = se.checkpoint();
  std::vector<std::vector<float>> first;
  for (int t = 0; t < steps; ++t) {
    const int id = (t * 7919 + 13) % vocab;
    const ForwardOptions opt{.hidden = t % 50 == 0, .routes = t % 3 == 1};
    const ForwardResult rg = graphs->forward(&id, 1, sg, opt), re = eager->forward(&id, 1, se, opt);
    ASSERT_EQ(rg.logits, re.logits) << dir << ": decode step " << t;
    ASSERT_EQ(rg.hidden_pre_norm, re.hidden_pre_norm) << dir << ": decode step " << t;
    ASSERT_EQ(rg.hidden_post_norm, re.hidden_post_norm) << dir << ": decode step " << t;
    ASSERT_EQ(rg.routes, re.routes) << dir << ": decode step " << t;
    ASSERT_EQ(rg.router_probs, re.router_probs) << dir << ": decode step " << t;
    if (opt.routes) {
      ASSERT_FALSE(rg.routes.empty()) << dir << ": decode step " << t;
    }
    if (t < 3) first.push_back(rg.logits);
  }
  sg.restore(cg);
  se.restore(ce);
  for (int t = 0; t < 3; ++t) {
    const int id = (t * 7919 + 13) % vocab;
    const ForwardResult rg = graphs->forward(&id, 1, sg), re = eager->forward(&id, 1, se);
    ASSERT_EQ(rg.logits, re.logits) << dir << ": decode step " << t << " after the restore";
    EXPECT_EQ(rg.logits, first[size_t(t)]) << dir << ": decode step " << t << " after the restore";
  }
}

TEST(CudaForward, CapturedDecodeStepsMatchEagerOnes) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", src);
  const std::string dir = test::scratch_dir("cuda-graph") + "/next16";
  convert_checkpoint({.from = src, .out = dir, .expert_bits = 16});
  check_captured_steps_match_eager(dir, 600);
  const std::string pycoder = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
  if (std::filesystem::exists(pycoder)) check_captured_steps_match_eager(pycoder, 40);
}

// Greedy decode run ahead on the GPU (Model::decode with DecodeOptions::greedy) makes the tokens of step-by-step decode
// (eager steps, the first maximum of their logits) and their routes, and leaves the state where
// those steps leave it: over a KV cache's growth (a capture mid-run), and when on_step stops it
// early, where the step after the refused token has run too.
// Greedy decode steps: the pick is the first maximum, which the GPU makes itself.
DecodeOptions greedy_steps(bool routes) {
  return {.pick = [] { return PickInputs{}; }, .greedy = true, .routes = routes};
}

TEST(CudaForward, DecodeAheadIsStepByStepDecode) {
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
  ModelOptions ahead_opt = on_gpu();
  ahead_opt.context = 24;  // the caches hold 24 positions, then grow: the prompt and 40 steps pass it
  ModelOptions eager_opt = ahead_opt;
  eager_opt.cuda_graphs = false;
  auto ahead = load_model(dir, ahead_opt), eager = load_model(dir, eager_opt);
  ASSERT_TRUE(decodes_ahead(*ahead));
  ASSERT_FALSE(decodes_ahead(*eager));
  auto argmax = [](const std::vector<float>& l) { return int(std::max_element(l.begin(), l.end()) - l.begin()); };
  State sa = ahead->new_state(), se = eager->new_state();
  std::vector<int> prompt;
  for (int i = 0; i < 10; ++i) prompt.push_back((i * 7919 + 13) % ahead->config().vocab);
  const int first = argmax(ahead->forward(prompt.data(), int(prompt.size()), sa).logits);
  ASSERT_EQ(argmax(eager->forward(prompt.data(), int(prompt.size()), se).logits), first);
  // Eager steps from `from`: each step's token, n of them.
  auto step_by_step = [&](int from, int n) {
    std::vector<int> out;
    for (int t = from; int(out.size()) < n;) out.push_back(t = argmax(eager->forward(&t, 1, se).logits));
    return out;
  };
  auto expect_same_state = [&](const char* when) {
    EXPECT_EQ(sa.position(), se.position()) << when;
    const int probe = 77;
    EXPECT_EQ(ahead->forward(&probe, 1, sa).logits, eager->forward(&probe, 1, se).logits) << when;
  };

  std::vector<int> got;
  auto all = [&](const ForwardResult& r) { return got.push_back(r.token), true; };
  EXPECT_EQ(ahead->decode(sa, first, 40, greedy_steps(false), all), 40);
  EXPECT_EQ(got, step_by_step(first, 40));
  expect_same_state("after 40 steps");

  got.clear();
  auto five = [&](const ForwardResult& r) { return got.push_back(r.token), got.size() < 5; };
  EXPECT_EQ(ahead->decode(sa, first, 40, greedy_steps(false), five), 6);
  const std::vector<int> want = step_by_step(first, 6);
  EXPECT_EQ(got, std::vector<int>(want.begin(), want.begin() + 5));
  expect_same_state("after on_step stopped at the 5th token");

  // With routes, each step's are the eager step's.
  std::vector<ForwardResult> steps;
  auto keep = [&](const ForwardResult& r) { return steps.push_back(r), true; };
  EXPECT_EQ(ahead->decode(sa, first, 8, greedy_steps(true), keep), 8);
  ASSERT_EQ(steps.size(), 8u);
  for (int s = 0, t = first; s < 8; ++s) {
    const ForwardResult e = eager->forward(&t, 1, se, {.routes = true});
    t = argmax(e.logits);
    EXPECT_EQ(steps[size_t(s)].token, t) << "step " << s;
    EXPECT_EQ(steps[size_t(s)].routes, e.routes) << "step " << s;
  }
  expect_same_state("after 8 steps with routes");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaForward,
                         ::testing::ValuesIn(test::fixture_cases()),
                         [](const auto& info) { return test::fixture_case_name(info.param); });

}  // namespace
}  // namespace ms
