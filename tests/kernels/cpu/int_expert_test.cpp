// int_dot::silu and exp_nonpositive (the activation a CPU and a GPU expert share) against double
// precision over the whole float range, and cpu::int_expert against an expert computed in double
// from the dequantized weights. The GPU side of the bits is tests/kernels/cuda/int_gemm_test.cpp.
#include "kernels/cpu/int_expert.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/int_dot.h"
#include "quant/affine.h"
#include "quant_support.h"
#include "util/error.h"

namespace ms {
namespace {

// Distance in ulps of float f from double r (f's own ulp; at least the smallest subnormal).
double ulps(float f, double r) {
  const double ulp = std::max(double(std::nextafter(std::fabs(f), INFINITY)) - std::fabs(f),
                              double(std::numeric_limits<float>::denorm_min()));
  return std::fabs(double(f) - r) / ulp;
}

// Samples spread over every binade of [lo, hi) (both signs where lo < 0), and the edges.
std::vector<float> sweep(float lo, float hi) {
  std::vector<float> v = {0.f, -0.f, lo, std::nextafter(hi, lo), -1e-45f, 1e-45f, -87.3f, -103.4f, -103.5f, -104.f};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  for (int e = -149; e < 8; ++e)
    for (int i = 0; i < 64; ++i) {
      const float m = std::ldexp(mant(rng), e);
      for (float s : {m, -m})
        if (s >= lo && s < hi) v.push_back(s);
    }
  return v;
}

TEST(IntDotSilu, ExpWithinAnUlp) {
  double worst = 0;
  for (float a : sweep(-110.f, 0.f)) {
    if (a > 0.f) continue;
    const float got = int_dot::exp_nonpositive(a);
    const double want = std::exp(double(a));
    if (want < double(std::numeric_limits<float>::denorm_min()) / 2) {
      EXPECT_EQ(got, 0.f) << a;
      continue;
    }
    const double d = ulps(got, want);
    worst = std::max(worst, d);
    EXPECT_LE(d, 1.0) << "exp(" << a << ") = " << got << ", want " << want;
  }
  EXPECT_TRUE(std::isnan(int_dot::exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(int_dot::exp_nonpositive(-INFINITY), 0.f);
  RecordProperty("worst_ulps", std::to_string(worst));
}

TEST(IntDotSilu, WithinThreeUlpsOfSilu) {
  for (float x : sweep(-200.f, 200.f)) {
    const float got = int_dot::silu(x);
    const double want = double(x) / (1.0 + std::exp(-double(x)));
    if (std::exp(-std::fabs(double(x))) < std::ldexp(1.0, -126)) {
      // Far left, e·r is subnormal: rounded to a step of 2^-149 (and e itself to one), then times x.
      EXPECT_LE(std::fabs(double(got) - want), (std::fabs(double(x)) + 1) * std::ldexp(1.0, -148)) << "silu(" << x << ")";
      continue;
    }
    // e within an ulp, then four roundings (1 + e, the quotient, e·r, the product with x).
    EXPECT_LE(ulps(got, want), 3.0) << "silu(" << x << ") = " << got << ", want " << want;
  }
  EXPECT_EQ(int_dot::silu(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(int_dot::silu(std::numeric_limits<float>::quiet_NaN())));
}

// The expert in double from the dequantized weights: weight·down(silu(gate·x)·(up·x)), and for
// each output the sum of the magnitudes of its terms (the scale of its rounding).
void expert_reference(const std::vector<float>& x, const QuantMat& g, const QuantMat& u, const QuantMat& d, double wt,
                      std::vector<double>* y, std::vector<double>* mag) {
  std::vector<float> row(size_t(std::max(g.cols, d.cols)));
  std::vector<double> a(size_t(g.rows)), am(size_t(g.rows));
  for (int r = 0; r < g.rows; ++r) {
    double gs = 0, us = 0, gm = 0, um = 0;
    dequantize_row(g, r, row.data());
    for (int c = 0; c < g.cols; ++c) gs += double(row[size_t(c)]) * x[size_t(c)], gm += std::fabs(double(row[size_t(c)]) * x[size_t(c)]);
    dequantize_row(u, r, row.data());
    for (int c = 0; c < u.cols; ++c) us += double(row[size_t(c)]) * x[size_t(c)], um += std::fabs(double(row[size_t(c)]) * x[size_t(c)]);
    const double s = gs / (1 + std::exp(-gs));
    a[size_t(r)] = s * us;
    am[size_t(r)] = std::fabs(s) * um + gm * std::fabs(us);  // how far rounding in gate and up can move it
  }
  y->assign(size_t(d.rows), 0), mag->assign(size_t(d.rows), 0);
  for (int r = 0; r < d.rows; ++r) {
    dequantize_row(d, r, row.data());
    for (int c = 0; c < d.cols; ++c) {
      (*y)[size_t(r)] += wt * row[size_t(c)] * a[size_t(c)];
      (*mag)[size_t(r)] += std::fabs(wt * row[size_t(c)]) * (std::fabs(a[size_t(c)]) + am[size_t(c)]);
    }
  }
}

TEST(IntExpert, MatchesTheExpertInDouble) {
  struct Case {
    int bits_gate_up, bits_down, group, H, I;
    ScaleType st;
  };
  const Case cases[] = {{4, 4, 64, 256, 128, ScaleType::BF16},
                        {8, 4, 32, 128, 96, ScaleType::F16},
                        {4, 8, 128, 512, 256, ScaleType::BF16}};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const Case& c : cases) {
    struct Owned {  // the codes and the typed scales the view reads (moves keep their buffers)
      QuantBuffer qb;
      test::TypedScales typed;
    };
    auto make = [&](int rows, int cols, int bits) {
      std::vector<float> w(size_t(rows) * cols);
      for (auto& v : w) v = 0.05f * normal(rng) + 0.01f;
      Owned o{quantize(w.data(), rows, cols, bits, c.group), {}};
      o.typed = test::with_scale_type(o.qb, c.st, rng);
      return o;
    };
    const Owned go = make(c.I, c.H, c.bits_gate_up), uo = make(c.I, c.H, c.bits_gate_up),
                do_ = make(c.H, c.I, c.bits_down);
    const test::TypedScales &g = go.typed, &u = uo.typed, &d = do_.typed;
    std::vector<float> x(size_t(c.H));
    for (auto& v : x) v = normal(rng);
    const float wt = 0.37f;
    std::vector<float> got(size_t(c.H), NAN);
    cpu::int_expert(x.data(), g.view, u.view, d.view, wt, got.data());
    std::vector<double> want, mag;
    expert_reference(x, g.view, u.view, d.view, wt, &want, &mag);
    const std::string what = "gate/up q" + std::to_string(c.bits_gate_up) + " down q" + std::to_string(c.bits_down) +
                             " g" + std::to_string(c.group) + " " + scale_type_name(c.st);
    // Float sums of a few hundred terms, each rounded a few times: well inside 2^-16 of their scale.
    for (int h = 0; h < c.H; ++h)
      ASSERT_LE(std::fabs(double(got[size_t(h)]) - want[size_t(h)]), std::ldexp(mag[size_t(h)], -16) + 1e-30)
          << what << " output " << h;
  }
}

TEST(IntExpert, RefusesOtherLayoutsByName) {
  std::vector<float> w(64 * 64, 0.1f), x(64, 1.f), y(64);
  const QuantBuffer g = quantize(w.data(), 64, 64, 4, 64), d3 = quantize(w.data(), 64, 64, 3, 64);
  try {
    cpu::int_expert(x.data(), g.view(), g.view(), d3.view(), 1.f, y.data());
    FAIL() << "a 3-bit down projection was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("down 3-bit group 64"), std::string::npos) << e.what();
  }
}

// int_experts (one split of x for every gate and up, their rows shared out at once) gives each
// expert the bits int_expert gives it alone, as int_expert_tokens does each token of a chunk;
// experts of two layouts are refused.
TEST(IntExpert, ManyOnOneInputAreEachAloneBitForBit) {
  constexpr int H = 256, I = 128, n = 5;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto make = [&](int rows, int cols, int bits) {
    std::vector<float> w(size_t(rows) * cols);
    for (auto& v : w) v = 0.05f * normal(rng);
    return quantize(w.data(), rows, cols, bits, 64);
  };
  std::vector<QuantBuffer> owned;
  for (int e = 0; e < n; ++e) owned.push_back(make(I, H, 4)), owned.push_back(make(I, H, 4)), owned.push_back(make(H, I, 8));
  std::vector<float> x(H);
  for (auto& v : x) v = normal(rng);
  std::vector<float> many(size_t(n) * H, NAN), alone(size_t(n) * H, NAN);
  std::vector<cpu::IntExpertJob> jobs;
  for (int e = 0; e < n; ++e) {
    const QuantMat g = owned[size_t(3 * e)].view(), u = owned[size_t(3 * e + 1)].view(), d = owned[size_t(3 * e + 2)].view();
    const float wt = 0.1f * float(e + 1);
    jobs.push_back({g, u, d, wt, many.data() + size_t(e) * H});
    cpu::int_expert(x.data(), g, u, d, wt, alone.data() + size_t(e) * H);
  }
  cpu::int_experts(x.data(), jobs);
  for (size_t i = 0; i < many.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(many[i]), std::bit_cast<uint32_t>(alone[i])) << "expert " << i / H << " row " << i % H;

  // A prompt chunk's expert over several tokens: each token's row, scaled, is int_expert's.
  const int T = 7;
  std::vector<float> xs(size_t(T) * H), ys(size_t(T) * H, NAN), one(H);
  for (auto& v : xs) v = normal(rng);
  const QuantMat g = owned[0].view(), u = owned[1].view(), d = owned[2].view();
  cpu::int_expert_tokens(xs.data(), T, g, u, d, ys.data());
  for (int t = 0; t < T; ++t) {
    cpu::int_expert(xs.data() + size_t(t) * H, g, u, d, 0.3f, one.data());
    for (int h = 0; h < H; ++h)
      ASSERT_EQ(std::bit_cast<uint32_t>(0.3f * ys[size_t(t) * H + size_t(h)]), std::bit_cast<uint32_t>(one[size_t(h)]))
          << "token " << t << " row " << h;
  }

  const QuantBuffer g8 = make(I, H, 8), u8 = make(I, H, 8);
  jobs[2].gate = g8.view(), jobs[2].up = u8.view();
  try {
    cpu::int_experts(x.data(), jobs);
    FAIL() << "experts of two layouts were taken as one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two layouts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ms
