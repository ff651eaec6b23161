// Each CPU kernel against a naive double-precision reference, over several shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "random.h"
#include "util/half.h"

namespace ms::cpu {
namespace {

// Tolerance for a float32 dot product of length K against a double reference: rounding grows
// with K and with the magnitude of the terms (sum |x_i w_i|).
double dot_tol(int K, double abs_sum) { return 4.0 * K * 6e-8 * abs_sum + 1e-6; }

TEST(Matmul, Bf16AndF32MatchNaiveReference) {
  for (int T : {1, 3, 17}) {
    for (auto [N, K] : {std::pair{1, 1}, {7, 33}, {64, 128}, {130, 257}, {300, 1000}}) {
      auto x = randn(size_t(T) * size_t(K), 1);
      auto wf = randn(size_t(N) * size_t(K), 2, 0.1f);
      std::vector<bf16> wb(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
      for (WeightType type : {WeightType::F32, WeightType::BF16}) {
        Mat W{type, type == WeightType::F32 ? static_cast<const void*>(wf.data()) : wb.data(), N, K};
        std::vector<float> y(size_t(T) * size_t(N));
        matmul(x.data(), T, W, y.data());
        for (int t = 0; t < T; ++t)
          for (int n = 0; n < N; ++n) {
            double ref = 0, abs_sum = 0;
            for (int k = 0; k < K; ++k) {
              const size_t wi = size_t(n) * size_t(K) + size_t(k);
              const double w = type == WeightType::F32 ? wf[wi] : bf16_to_f32(wb[wi]);
              ref += double(x[size_t(t) * size_t(K) + size_t(k)]) * w;
              abs_sum += std::abs(double(x[size_t(t) * size_t(K) + size_t(k)]) * w);
            }
            ASSERT_NEAR(y[size_t(t) * size_t(N) + size_t(n)], ref, dot_tol(K, abs_sum))
                << "T=" << T << " N=" << N << " K=" << K << " t=" << t << " n=" << n;
          }
      }
    }
  }
}

TEST(Matmul, RowResultDoesNotDependOnBatch) {
  // The MoE regroups tokens freely (waves, streaming): a row's value must be bit-identical
  // whatever batch it is computed in.
  const int N = 96, K = 200, T = 9;
  auto x = randn(size_t(T) * K, 3);
  auto w = randn(size_t(N) * K, 4);
  Mat W{WeightType::F32, w.data(), N, K};
  std::vector<float> all(size_t(T) * N), one(N);
  matmul(x.data(), T, W, all.data());
  for (int t = 0; t < T; ++t) {
    matmul(x.data() + size_t(t) * K, 1, W, one.data());
    for (int n = 0; n < N; ++n) ASSERT_EQ(one[size_t(n)], all[size_t(t) * N + size_t(n)]);
  }
}

TEST(RmsNorm, MatchesReferenceWithBothOffsets) {
  for (int dim : {1, 32, 129}) {
    auto x = randn(size_t(3) * size_t(dim), 5, 3.f);
    auto w = randn(size_t(dim), 6, 0.2f);
    for (float offset : {0.f, 1.f}) {
      std::vector<float> out(x.size());
      rmsnorm(x.data(), 3, dim, w.data(), offset, 1e-6f, out.data());
      for (int r = 0; r < 3; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += double(x[size_t(r * dim + i)]) * x[size_t(r * dim + i)];
        const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; ++i)
          ASSERT_NEAR(out[size_t(r * dim + i)], x[size_t(r * dim + i)] * inv * (offset + w[size_t(i)]), 1e-5);
      }
    }
  }
}

TEST(Rope, RotatesTheFirstRotaryDimsOnly) {
  const int T = 5, heads = 3, hd = 16, pos0 = 7;
  for (int rot : {16, 4}) {
    auto x = randn(size_t(T) * heads * hd, 7);
    auto y = x;
    rope(y.data(), T, heads, hd, rot, pos0, 10000.0);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < heads; ++h) {
        const float* a = x.data() + (size_t(t) * heads + size_t(h)) * hd;
        const float* b = y.data() + (size_t(t) * heads + size_t(h)) * hd;
        for (int i = 0; i < rot / 2; ++i) {
          const double ang = (pos0 + t) / std::pow(10000.0, 2.0 * i / rot);
          ASSERT_NEAR(b[i], a[i] * std::cos(ang) - a[i + rot / 2] * std::sin(ang), 1e-4);
          ASSERT_NEAR(b[i + rot / 2], a[i + rot / 2] * std::cos(ang) + a[i] * std::sin(ang), 1e-4);
        }
        for (int i = rot; i < hd; ++i) ASSERT_EQ(b[i], a[i]);
      }
  }
}

TEST(Softmax, RowsSumToOneAndMatchReference) {
  auto x = randn(3 * 50, 11, 5.f);
  auto y = x;
  softmax(y.data(), 3, 50);
  for (int r = 0; r < 3; ++r) {
    double sum = 0;
    for (int i = 0; i < 50; ++i) sum += std::exp(double(x[size_t(r * 50 + i)]));
    for (int i = 0; i < 50; ++i) ASSERT_NEAR(y[size_t(r * 50 + i)], std::exp(double(x[size_t(r * 50 + i)])) / sum, 1e-6);
  }
}

// warp_order_sum is a float sum of the values (within n ulps of the exact one), in its stated
// order: for n <= 32 each lane holds one value, so the butterfly alone decides the rounding, and
// a value that lane 0 would absorb in index order survives when its partners cancel first.
TEST(WarpOrderSum, SumsInTheOrderOfAWarp) {
  for (int n : {1, 7, 32, 33, 512, 1000}) {
    const auto v = randn(size_t(n), 12, 3.f);
    double exact = 0;
    for (float x : v) exact += x;
    ASSERT_NEAR(warp_order_sum(v.data(), n), exact, 1e-6 * n) << n;
  }
  // Lanes 0 and 16 cancel before anything meets lane 1's 1: index order would lose it.
  std::vector<float> v(32, 0.f);
  v[0] = 1e8f, v[1] = 1.f, v[16] = -1e8f;
  EXPECT_EQ(warp_order_sum(v.data(), 32), 1.f);
  float sequential = 0.f;
  for (float x : v) sequential += x;
  EXPECT_EQ(sequential, 0.f);
}

TEST(TopK, LargestFirstLowerIndexOnTies) {
  const float x[] = {0.1f, 0.5f, 0.3f, 0.5f, 0.9f, 0.0f};
  int idx[4];
  top_k(x, 6, 4, idx);
  EXPECT_EQ(std::vector<int>(idx, idx + 4), (std::vector<int>{4, 1, 3, 2}));
}

TEST(SiluMul, MatchesDefinition) {
  auto g = randn(100, 12, 4.f), u = randn(100, 13);
  std::vector<float> out(100);
  silu_mul(g.data(), u.data(), out.data(), 100);
  for (size_t i = 0; i < 100; ++i) ASSERT_NEAR(out[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5);
}

}  // namespace
}  // namespace ms::cpu
