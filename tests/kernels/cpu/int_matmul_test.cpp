// cpu::int_matmul (kernels/int_dot.h's integer product) against sums in double of the dequantized
// weights, within a bound derived from its arithmetic; exact where every step is; NaN and
// infinity carried; other layouts refused by name.
#include "kernels/cpu/int_matmul.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/int_dot.h"
#include "quant/affine.h"
#include "quant_support.h"
#include "util/error.h"
#include "util/half.h"

namespace ms {
namespace {

TEST(IntDot, SlotOrderIsAPermutation) {
  for (int bits : {4, 8}) {
    std::vector<int> seen(int_dot::kChunk, 0);
    for (int c = 0; c < int_dot::kChunk; ++c) {
      const int s = int_dot::slot_of(bits, c);
      ASSERT_GE(s, 0);
      ASSERT_LT(s, int_dot::kChunk);
      ++seen[size_t(s)];
      EXPECT_EQ(int_dot::code_of_slot(bits, s), c) << bits << " bits, code " << c;
    }
    for (int n : seen) EXPECT_EQ(n, 1);
  }
  // At 4 bits slot 4t + m holds the low nibble of byte m of word t: code 8t + 2m.
  EXPECT_EQ(int_dot::slot_of(4, 8 * 2 + 2 * 3), 4 * 2 + 3);
  EXPECT_EQ(int_dot::slot_of(4, 8 * 2 + 2 * 3 + 1), 16 + 4 * 2 + 3);
}

TEST(IntDot, DigitsRecombineExactly) {
  std::mt19937 rng(1);
  const int32_t lim = (1 << 30) - 64;  // the largest |X| a split makes (int_matmul.cpp)
  std::uniform_int_distribution<int32_t> d(-lim, lim);
  std::vector<int32_t> xs = {0, 1, -1, 127, 128, -128, -129, 0x808080, -0x808080, lim, -lim};
  for (int i = 0; i < 10000; ++i) xs.push_back(d(rng));
  for (int32_t X : xs) {
    const uint32_t b = int_dot::digits(X);
    int32_t c[4];
    for (int p = 0; p < 4; ++p) c[p] = int8_t(uint8_t(b >> (8 * p)));
    EXPECT_EQ(int_dot::combine(c[0], c[1], c[2], c[3]), int64_t(X)) << X;
  }
}

struct Case {
  int bits, group, rows, cols, T;
};

// int_dot.h read as plainly as it is written: D summed in int64 one code at a time.
std::vector<float> plain_int_matmul(const std::vector<float>& x, int T, const QuantMat& W) {
  const cpu::IntSplit s = cpu::int_split(x.data(), T, W.cols, W.group);
  const int units = W.cols / W.group;
  std::vector<float> y(size_t(T) * W.rows);
  std::vector<uint8_t> q(size_t(W.cols));
  for (int r = 0; r < W.rows; ++r) {
    unpack_bits(W.q + size_t(r) * W.row_bytes(), 0, size_t(W.cols), W.bits, q.data());
    for (int t = 0; t < T; ++t) {
      float acc = 0.f;
      for (int u = 0; u < units; ++u) {
        int64_t D = 0;
        for (int c = u * W.group; c < (u + 1) * W.group; ++c) D += int64_t(q[size_t(c)]) * s.X[size_t(t) * W.cols + c];
        const size_t g = size_t(r) * units + size_t(u), k = size_t(t) * units + size_t(u);
        acc = std::fma(float(D), W.scale(g) * s.pow2[k], acc);
        acc = std::fma(W.bias(g), s.xsum[k], acc);
      }
      y[size_t(t) * W.rows + size_t(r)] = acc;
    }
  }
  return y;
}

// The targets int_matmul is built for that this CPU runs; each check runs on all of them.
std::vector<int64_t> kernel_targets() {
  std::vector<int64_t> out;
  for (int64_t t : {int64_t(HWY_AVX3_DL), int64_t(HWY_AVX3), int64_t(HWY_AVX2), int64_t(HWY_BASELINE_SCALAR)})
    if (hwy::SupportedTargets() & t) out.push_back(t);
  return out;
}

// y in double from the dequantized weights, and the bound of int_dot.h's error on each output:
// X rounds by at most 2^(e−1) a value (2^e ≤ 2^-29 of the unit's largest), and the float steps
// (float(D), s·2^e, two FMAs a unit) add up to (2·units + 8)·ε of Σ|x|·(|s·q| + |b|).
void reference(const std::vector<float>& x, int T, const QuantMat& W, std::vector<double>* y, std::vector<double>* bound) {
  const int units = W.cols / W.group;
  y->assign(size_t(T) * W.rows, 0.0);
  bound->assign(y->size(), 0.0);
  std::vector<float> w(size_t(W.cols));
  const double eps = std::numeric_limits<float>::epsilon() / 2;
  for (int r = 0; r < W.rows; ++r) {
    dequantize_row(W, r, w.data());
    for (int t = 0; t < T; ++t) {
      const float* xt = x.data() + size_t(t) * W.cols;
      double acc = 0, mag = 0, split = 0;
      for (int u = 0; u < units; ++u) {
        const double b = W.bias(size_t(r) * units + size_t(u));
        double mx = 0, sq = 0;
        for (int c = u * W.group; c < (u + 1) * W.group; ++c) {
          acc += double(xt[c]) * w[size_t(c)];
          mag += std::fabs(xt[c]) * (std::fabs(w[size_t(c)] - b) + std::fabs(b));
          mx = std::max(mx, double(std::fabs(xt[c])));
          sq += std::fabs(w[size_t(c)] - b);
        }
        split += sq * mx * std::ldexp(1.0, -29);
      }
      (*y)[size_t(t) * W.rows + size_t(r)] = acc;
      (*bound)[size_t(t) * W.rows + size_t(r)] = (2.0 * units + 8) * eps * mag + split;
    }
  }
}

// x of normal values, every eighth scaled by 2^-20 (small values beside large ones in a unit).
std::vector<float> inputs(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng) * (i % 8 == 3 ? std::ldexp(1.f, -20) : 1.f);
  return x;
}

TEST(IntMatmul, WithinItsBoundOfExactSums) {
  const Case cases[] = {{4, 64, 33, 256, 1}, {4, 32, 70, 512, 5}, {4, 128, 16, 1024, 17},
                        {8, 32, 9, 128, 3},  {8, 64, 40, 384, 2}, {8, 128, 5, 256, 33}, {8, 128, 12, 256, 1}};
  std::mt19937 rng(7);
  for (const Case& k : cases)
    for (ScaleType st : {ScaleType::BF16, ScaleType::F16}) {
      std::normal_distribution<float> normal(0.f, 1.f);
      std::vector<float> w(size_t(k.rows) * k.cols);
      for (auto& v : w) v = 0.05f * normal(rng) + 0.01f;
      const QuantBuffer qb = quantize(w.data(), k.rows, k.cols, k.bits, k.group);
      const test::TypedScales typed = test::with_scale_type(qb, st, rng);
      const QuantMat W = st == ScaleType::BF16 ? qb.view() : typed.view;
      const std::vector<float> x = inputs(size_t(k.T) * k.cols, rng);
      std::vector<double> want, bound;
      reference(x, k.T, W, &want, &bound);
      const std::vector<float> plain = plain_int_matmul(x, k.T, W);
      const std::string what = "q" + std::to_string(k.bits) + " g" + std::to_string(k.group) + " " +
                               scale_type_name(st) + " " + std::to_string(k.rows) + "x" + std::to_string(k.cols) +
                               " T=" + std::to_string(k.T);
      for (size_t i = 0; i < plain.size(); ++i)
        ASSERT_LE(std::fabs(plain[i] - want[i]), bound[i]) << what << " output " << i;
      for (int64_t target : kernel_targets()) {
        hwy::SetSupportedTargetsForTest(target);
        ASSERT_EQ(std::string(cpu::int_matmul_target()), hwy::TargetName(target));
        std::vector<float> y(want.size(), NAN);
        cpu::int_matmul(x.data(), k.T, W, y.data());
        EXPECT_EQ(0, std::memcmp(y.data(), plain.data(), y.size() * sizeof(float)))
            << what << " on " << hwy::TargetName(target) << ": not the bits of the plain reading";
      }
      hwy::SetSupportedTargetsForTest(0);
    }
}

// Integer x, unit scales and zero biases: every step is exact, so y is Σ q·x itself.
TEST(IntMatmul, ExactWhereEveryStepIs) {
  for (int bits : {4, 8}) {
    const int rows = 6, cols = 128, group = 64, T = 3;
    std::mt19937 rng{uint32_t(bits)};
    std::uniform_int_distribution<int> code(0, (1 << bits) - 1), xv(-100, 100);
    std::vector<uint8_t> q(size_t(rows) * cols);
    for (auto& v : q) v = uint8_t(code(rng));
    std::vector<uint8_t> packed(size_t(rows) * cols * bits / 8);
    for (int r = 0; r < rows; ++r)
      pack_bits(q.data() + size_t(r) * cols, size_t(cols), bits, packed.data() + size_t(r) * cols * bits / 8);
    std::vector<uint16_t> scales(size_t(rows) * cols / group, f32_to_bf16(1.f)), biases(scales.size(), 0);
    const QuantMat W{packed.data(), scales.data(), biases.data(), rows, cols, bits, group};
    std::vector<float> x(size_t(T) * cols);
    for (auto& v : x) v = float(xv(rng));
    std::vector<float> y(size_t(T) * rows);
    cpu::int_matmul(x.data(), T, W, y.data());
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < rows; ++r) {
        int64_t want = 0;
        for (int c = 0; c < cols; ++c) want += int64_t(q[size_t(r) * cols + c]) * int64_t(x[size_t(t) * cols + c]);
        EXPECT_EQ(double(y[size_t(t) * rows + r]), double(want)) << bits << " bits, t " << t << " r " << r;
      }
  }
}

TEST(IntMatmul, CarriesNaNAndInfinity) {
  const int rows = 4, cols = 128, T = 3;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> w(size_t(rows) * cols);
  for (auto& v : w) v = normal(rng);
  const QuantBuffer qb = quantize(w.data(), rows, cols, 4, 64);
  std::vector<float> x(size_t(T) * cols);
  for (auto& v : x) v = normal(rng);
  x[5] = std::numeric_limits<float>::quiet_NaN();                   // token 0, unit 0
  x[size_t(cols) + 100] = std::numeric_limits<float>::infinity();  // token 1, unit 1
  std::vector<float> y(size_t(T) * rows);
  cpu::int_matmul(x.data(), T, qb.view(), y.data());
  for (int r = 0; r < rows; ++r) {
    EXPECT_TRUE(std::isnan(y[size_t(r)]));
    EXPECT_TRUE(std::isnan(y[size_t(rows) + r]));
    EXPECT_TRUE(std::isfinite(y[size_t(2 * rows) + r]));
  }
}

TEST(IntMatmul, RefusesOtherLayoutsByName) {
  std::vector<float> w(64 * 128, 0.5f), x(128, 1.f), y(64);
  for (auto [bits, group] : {std::pair{3, 64}, std::pair{2, 32}, std::pair{6, 32}}) {
    const QuantBuffer qb = quantize(w.data(), 64, 128, bits, group);
    EXPECT_FALSE(cpu::int_matmul_supported(qb.view()));
    try {
      cpu::int_matmul(x.data(), 1, qb.view(), y.data());
      ADD_FAILURE() << bits << "-bit weights ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bits) + "-bit group " + std::to_string(group)),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace ms
