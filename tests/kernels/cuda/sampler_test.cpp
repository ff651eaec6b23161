// cuda::sample, through cuda::pick of Sampler::next, against Sampler::sample (cpu::sample):
// the same tokens for the same logits, seen tokens and seed, draw after draw.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "runtime/sampler.h"

namespace ms::cuda::test {
namespace {

// Logits of one kind for a vocabulary; new ones each step.
using LogitGen = std::function<Vec(Rng&, int)>;

Vec normal_logits(Rng& rng, int vocab) { return rng.normals(size_t(vocab), 3.0f); }

// Rounded to steps of 0.5: most values tie with hundreds of others, the top few too.
Vec tied_logits(Rng& rng, int vocab) {
  Vec v = rng.normals(size_t(vocab), 2.0f);
  for (float& x : v) x = std::round(x * 2.0f) / 2.0f;
  return v;
}

// Huge, tiny, denormal and signed-zero values among ordinary ones, the largest repeated.
Vec extreme_logits(Rng& rng, int vocab) {
  Vec v = rng.normals(size_t(vocab));
  const float specials[] = {1e30f, -1e30f, 3e37f, -3e37f, 1e-40f, -1e-40f, 0.0f, -0.0f, 1e-30f, 60.0f, -60.0f};
  for (float& x : v)
    if (rng.uniform(0, 1) < 0.05f) x = specials[size_t(rng.uniform(0, 11)) % 11];
  for (int j = 0; j < 3; ++j) v[size_t(rng.uniform(0, float(vocab))) % size_t(vocab)] = 3e37f;
  return v;
}

struct Kind {
  const char* name;
  LogitGen gen;
};
const Kind kKinds[] = {{"normal", normal_logits}, {"tied", tied_logits}, {"extreme", extreme_logits}};

std::string describe(const SamplingParams& p) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "T=%g top_k=%d top_p=%g min_p=%g rep=%g pres=%g freq=%g seed=%llu", p.temperature,
                p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
                (unsigned long long)p.seed);
  return buf;
}

// Greedy with and without penalties, and sampling over temperatures x top-k x top-p x min-p x
// penalties, plus the cuts at their extremes.
std::vector<SamplingParams> param_grid(bool small) {
  std::vector<SamplingParams> out{{}, {.repetition_penalty = 1.3f, .presence_penalty = 0.5f, .frequency_penalty = 0.2f}};
  const std::vector<float> temps = small ? std::vector<float>{0.7f} : std::vector<float>{0.4f, 1.0f, 1.7f};
  for (float t : temps)
    for (int k : {0, 1, 40})
      for (float top_p : {1.0f, 0.9f})
        for (float min_p : {0.0f, 0.05f})
          for (bool pen : {false, true}) {
            if (small && k == 1) continue;
            SamplingParams p{.temperature = t, .top_k = k, .top_p = top_p, .min_p = min_p};
            if (pen) p.repetition_penalty = 1.2f, p.presence_penalty = 0.3f, p.frequency_penalty = 0.1f;
            out.push_back(p);
          }
  out.push_back({.temperature = 1.0f, .top_p = 0.3f});
  out.push_back({.temperature = 1.0f, .min_p = 0.5f});
  out.push_back({.temperature = 1.0f, .min_p = 1.0f});
  out.push_back({.temperature = 0.05f, .top_k = 200000});  // top_k beyond the vocabulary
  out.push_back({.temperature = 2.0f, .top_k = 7, .top_p = 0.95f, .min_p = 0.02f, .repetition_penalty = 0.8f});
  return out;
}

struct Tally {
  int draws = 0, mismatches = 0;
};

// `steps` draws of a CPU and a GPU sampler with the same parameters on the same logits; each step
// appends the CPU's token to the seen tokens.
void compare(const SamplingParams& p, const Kind& kind, int vocab, int steps, unsigned seed, SamplerWorkspace& ws,
             Tally& tally) {
  Rng rng(seed);
  Sampler cpu(p), gpu(p);
  std::vector<int> seen{-1, vocab, vocab + 7};  // outside the vocabulary: ignored by both
  for (int i = 0; i < 40; ++i) seen.push_back(int(rng.uniform(0, float(std::min(vocab, 64)))) % vocab);
  for (int s = 0; s < steps; ++s) {
    const Vec logits = kind.gen(rng, vocab);
    DeviceArray<float> d = dev(logits);
    const int want = cpu.sample(logits.data(), vocab, seen);
    const int got = pick(d.data(), vocab, gpu.next(seen, vocab), ws);
    ++tally.draws;
    if (got != want && ++tally.mismatches <= 10)
      ADD_FAILURE() << kind.name << " vocab " << vocab << " step " << s << " " << describe(p) << ": GPU token " << got
                    << ", CPU token " << want;
    seen.push_back(want);
  }
}

TEST(CudaSampler, HostDrawIsTheCpuDrawOverTotal) {
  // No GPU needed: the identity Sampler::next relies on for the same u as Sampler::sample.
  std::mt19937_64 a(11), b(11);
  Rng rng(5);
  for (int i = 0; i < 10000; ++i) {
    const double total = std::ldexp(double(rng.uniform(0.5f, 1.0f)), int(rng.uniform(-3, 3)));
    const double u = std::uniform_real_distribution<double>(0.0, total)(a);
    const double r = std::uniform_real_distribution<double>(0.0, 1.0)(b);
    ASSERT_EQ(u, r * total) << "draw " << i;
  }
}

TEST(CudaSampler, SmallVocabularyMatchesCpu) {
  MS_REQUIRE_CUDA();
  SamplerWorkspace ws;
  Tally tally;
  unsigned seed = 100;
  for (const SamplingParams& base : param_grid(false))
    for (const Kind& kind : kKinds)
      for (int vocab : {1000, 37})
        for (uint64_t s : {1u, 2u}) {
          SamplingParams p = base;
          p.seed = s * 7919 + seed;
          compare(p, kind, vocab, 12, seed++, ws, tally);
        }
  std::printf("[cuda-sampler] small vocabularies: %d draws, %d differ from the CPU's\n", tally.draws, tally.mismatches);
  EXPECT_EQ(tally.mismatches, 0);
}

TEST(CudaSampler, QwenVocabularyMatchesCpu) {
  MS_REQUIRE_CUDA();
  SamplerWorkspace ws;
  Tally tally;
  unsigned seed = 500;
  for (const SamplingParams& base : param_grid(true))
    for (const Kind& kind : kKinds) {
      SamplingParams p = base;
      p.seed = seed;
      compare(p, kind, 151936, 4, seed++, ws, tally);
    }
  std::printf("[cuda-sampler] vocab 151936: %d draws, %d differ from the CPU's\n", tally.draws, tally.mismatches);
  EXPECT_EQ(tally.mismatches, 0);
}

TEST(CudaSampler, TiesGoToTheLowestIndex) {
  MS_REQUIRE_CUDA();
  SamplerWorkspace ws;
  const Vec flat(5000, 0.25f);
  DeviceArray<float> d = dev(flat);
  for (SamplingParams p : {SamplingParams{}, SamplingParams{.temperature = 1.0f, .top_k = 1},
                           SamplingParams{.temperature = 1.0f, .top_p = 1e-6f}}) {
    Sampler s(p);
    EXPECT_EQ(pick(d.data(), 5000, s.next({}, 5000), ws), 0) << describe(p);
  }
}

// Greedy splits the vocabulary over blocks: the first maximum wins wherever the blocks' shares
// fall, call after call on one workspace.
TEST(CudaSampler, GreedyFindsTheFirstMaximumAcrossBlocks) {
  MS_REQUIRE_CUDA();
  constexpr int kVocab = 151936;
  SamplerWorkspace ws;
  Sampler s({});
  Rng rng(12);
  for (auto [first, second] : {std::pair{kVocab - 1, kVocab - 1}, {150000, 7}, {5, 140000}, {0, 100}, {3000, 3001}}) {
    Vec v = rng.normals(size_t(kVocab));
    v[size_t(first)] = v[size_t(second)] = 50.0f;
    DeviceArray<float> d = dev(v);
    EXPECT_EQ(pick(d.data(), kVocab, s.next({}, kVocab), ws), std::min(first, second)) << first << ", " << second;
  }
}

TEST(CudaSampler, RejectsAnEmptyVocabulary) {
  MS_REQUIRE_CUDA();
  SamplerWorkspace ws;
  ::ms::test::expect_error([&] { sample(nullptr, 0, nullptr, nullptr, 0, SampleArgs{}, 0.0, ws); }, {"vocab 0"});
}

// Time per call at Qwen's vocabulary, the one int copy back included.
TEST(CudaSampler, TimeAtQwenVocabulary) {
  MS_REQUIRE_CUDA();
  constexpr int kVocab = 151936, kCalls = 50;
  Rng rng(9);
  DeviceArray<float> d = dev(normal_logits(rng, kVocab));
  SamplerWorkspace ws;
  std::vector<int> seen(200);
  for (int& t : seen) t = int(rng.uniform(0, 5000));
  for (SamplingParams p : {SamplingParams{}, SamplingParams{.temperature = 0.7f, .top_p = 0.9f},
                           SamplingParams{.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .repetition_penalty = 1.1f}}) {
    Sampler s(p);
    pick(d.data(), kVocab, s.next(seen, kVocab), ws);  // sizes the workspace
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) pick(d.data(), kVocab, s.next(seen, kVocab), ws);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kCalls;
    std::printf("[cuda-sampler] vocab %d %-70s %.1f us per call\n", kVocab, describe(p).c_str(), us);
  }
}

}  // namespace
}  // namespace ms::cuda::test
