// cpu::sample (kernels/cpu/sample.h) against a naive reference: penalties, then the first
// maximum or the inverse CDF of the draw over the tempered softmax, cut by top-k, min-p, top-p.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/sample.h"
#include "random.h"

namespace ms::cpu {
namespace {

int sample_ref(std::vector<float> l, const PickInputs& in) {
  const SampleArgs& a = in.args;
  for (size_t i = 0; i < in.tokens.size(); ++i) {
    float& v = l[size_t(in.tokens[i])];
    if (a.repetition_penalty != 1.f) v = v > 0 ? v / a.repetition_penalty : v * a.repetition_penalty;
    v -= a.presence_penalty + a.frequency_penalty * float(in.counts[i]);
  }
  std::vector<int> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int x, int y) { return l[size_t(x)] > l[size_t(y)]; });
  if (a.temperature == 0.f) return ids[0];
  if (a.top_k > 0) ids.resize(std::min(ids.size(), size_t(a.top_k)));
  std::vector<double> p;
  for (int id : ids) p.push_back(std::exp((l[size_t(id)] - l[size_t(ids[0])]) / a.temperature));
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& q : p) q /= z;
  size_t keep = p.size();
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] < a.min_p * p[0]) {
      keep = i;
      break;
    }
  double mass = 0;
  for (size_t i = 0; i < keep && a.top_p < 1.f; ++i)
    if ((mass += p[i]) >= a.top_p) keep = i + 1;
  keep = std::max<size_t>(keep, 1);
  double u = in.r * std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(keep), 0.0);
  for (size_t i = 0; i < keep; ++i)
    if ((u -= p[i]) < 0) return ids[i];
  return ids[keep - 1];
}

TEST(Sample, GreedyIsTheFirstMaximum) {
  SampleScratch s;
  const std::vector<float> l = {0.5f, 2.f, -1.f, 2.f};
  EXPECT_EQ(sample(l.data(), 4, PickInputs{}, s), 1);
  PickInputs penalized{.args = {.repetition_penalty = 2.f}, .tokens = {1}, .counts = {1}};
  EXPECT_EQ(sample(l.data(), 4, penalized, s), 3);
}

TEST(Sample, DrawsMatchTheNaiveReference) {
  SampleScratch s;
  const int vocab = 200;
  int n = 0;
  for (const SampleArgs a : {SampleArgs{.temperature = 1.f}, SampleArgs{.temperature = 0.7f, .top_k = 10},
                             SampleArgs{.temperature = 1.3f, .top_p = 0.6f}, SampleArgs{.temperature = 1.f, .min_p = 0.05f},
                             SampleArgs{.temperature = 0.9f, .repetition_penalty = 1.3f, .presence_penalty = 0.4f,
                                        .frequency_penalty = 0.2f}})
    for (uint32_t seed = 0; seed < 20; ++seed, ++n) {
      const auto l = randn(size_t(vocab), 100 + seed, 2.f);
      PickInputs in{.args = a, .r = (seed + 0.5) / 20.0};
      if (a.repetition_penalty != 1.f) in.tokens = {3, 17, 42}, in.counts = {1, 2, 5};
      ASSERT_EQ(sample(l.data(), vocab, in, s), sample_ref(l, in)) << "case " << n;
    }
}

// Large candidate lists take the radix order (no top-k, or a top-k of 256 or more): ties broken
// by the lower id, -0 beside +0, masked ids (-inf) last, as the comparison sort has them.
TEST(Sample, LargeVocabulariesDrawAsTheReference) {
  SampleScratch s;
  const int vocab = 20000;
  auto l = randn(size_t(vocab), 7, 1.f);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::round(l[i] * 8.f) / 8.f;  // many ties
  l[10] = -0.f, l[11] = 0.f, l[12] = -0.f;
  for (size_t i = 100; i < l.size(); i += 97) l[i] = -INFINITY;
  int n = 0;
  for (const SampleArgs a : {SampleArgs{.temperature = 1.f}, SampleArgs{.temperature = 0.5f, .top_k = 300},
                             SampleArgs{.temperature = 2.f, .top_p = 0.9f}, SampleArgs{.temperature = 1.f, .top_k = 255}})
    for (int d = 0; d < 25; ++d, ++n) {
      const PickInputs in{.args = a, .r = (d + 0.37) / 25.0};
      ASSERT_EQ(sample(l.data(), vocab, in, s), sample_ref(l, in)) << "case " << n;
    }
  // Every value at zero: the draw walks ids in order.
  const std::vector<float> zeros(size_t(vocab), 0.f);
  const PickInputs in{.args = {.temperature = 1.f}, .r = 0.5};
  EXPECT_EQ(sample(zeros.data(), vocab, in, s), sample_ref(zeros, in));
}

}  // namespace
}  // namespace ms::cpu
