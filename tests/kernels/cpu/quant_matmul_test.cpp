#include "kernels/cpu/quant_matmul.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "quant_support.h"
#include "quant/affine.h"
#include "util/error.h"
#include "util/half.h"

namespace ms {
namespace {

using test::TypedScales;
using test::with_scale_type;

// The targets matmul_quant is built for that this CPU runs; each test runs on all of them.
std::vector<int64_t> kernel_targets() {
  std::vector<int64_t> out;
  for (int64_t t : {int64_t(HWY_AVX3), int64_t(HWY_AVX2), int64_t(HWY_BASELINE_SCALAR)})
    if (hwy::SupportedTargets() & t) out.push_back(t);
  return out;
}

struct Case {
  int bits, group, rows, cols, T;
};

// Naive reference: dequantize each row (quant/affine), dot in double. Also returns
// mag[t, r] = Σ_c |x_c|·(|s·q_c| + |b|), the size of the terms the kernel rounds (its split
// s·Σx·q + b·Σx can cancel, so Σ|x||w| alone understates them).
void reference(const std::vector<float>& x, int T, const QuantMat& W, std::vector<double>* y,
               std::vector<double>* mag) {
  y->assign(size_t(T) * W.rows, 0.0);
  mag->assign(y->size(), 0.0);
  std::vector<float> w(size_t(W.cols));
  for (int r = 0; r < W.rows; ++r) {
    dequantize_row(W, r, w.data());
    for (int t = 0; t < T; ++t) {
      double acc = 0, m = 0;
      for (int c = 0; c < W.cols; ++c) {
        double bias = W.bias(size_t(r) * W.groups_per_row() + size_t(c / W.group));
        double xc = x[size_t(t) * W.cols + size_t(c)];
        acc += xc * w[size_t(c)];
        m += std::fabs(xc) * (std::fabs(w[size_t(c)] - bias) + std::fabs(bias));
      }
      (*y)[size_t(t) * W.rows + size_t(r)] = acc;
      (*mag)[size_t(t) * W.rows + size_t(r)] = m;
    }
  }
}

void check_case(const Case& k, uint32_t seed, ScaleType scale_type = ScaleType::BF16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(size_t(k.rows) * k.cols), x(size_t(k.T) * k.cols);
  for (auto& v : w) v = 0.05f * normal(rng) + 0.01f;  // a small offset so biases are not ~ −max
  for (auto& v : x) v = normal(rng);
  QuantBuffer qb = quantize(w.data(), k.rows, k.cols, k.bits, k.group);
  const TypedScales typed = with_scale_type(qb, scale_type, rng);
  const QuantMat W = scale_type == ScaleType::BF16 ? qb.view() : typed.view;
  std::vector<double> want, mag;
  reference(x, k.T, W, &want, &mag);
  // Float rounding: products summed within a group (≤ group terms, split over lanes), group
  // results summed over the row (cols/group terms), plus scale·, bias· and Σx: a worst-case
  // relative bound γ_n ≈ n·2^-24 with n = group + cols/group + 8.
  const double eps = std::numeric_limits<float>::epsilon() / 2;
  const double rel = (k.group + k.cols / k.group + 8) * eps;
  for (int64_t target : kernel_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    ASSERT_EQ(std::string(cpu::matmul_quant_target()), hwy::TargetName(target));
    std::vector<float> y(want.size(), NAN);
    cpu::matmul_quant(x.data(), k.T, W, y.data());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_LE(std::fabs(y[i] - want[i]), rel * mag[i])
          << hwy::TargetName(target) << " bits " << k.bits << " group " << k.group << " scales "
          << scale_type_name(scale_type) << " rows " << k.rows
          << " cols " << k.cols << " T " << k.T << " at t " << i / size_t(k.rows) << " r " << i % size_t(k.rows)
          << ": got " << y[i] << " want " << want[i];
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(MatmulQuant, RunsOnSeveralTargets) {
  auto targets = kernel_targets();
  ASSERT_FALSE(targets.empty());
  std::string names;
  for (int64_t t : targets) names += std::string(hwy::TargetName(t)) + " ";
  std::printf("[ targets  ] %s\n", names.c_str());
}

TEST(MatmulQuant, MatchesReferenceEveryBitsGroupAndT) {
  uint32_t seed = 1;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {16, 32, 64, 128}) {
      if (group == 16 && bits < 4) continue;
      for (int T : {1, 2, 5, 16, 33})
        // Rows not a multiple of any block or chunk size; cols = group·k for k = 1, 3, 8.
        for (auto [rows, k] : {std::pair{1, 1}, std::pair{37, 3}, std::pair{131, 8}})
          check_case({bits, group, rows, group * k, T}, seed++);
    }
}

// f16 and f32 scales and biases (GGUF imports), on the widths and groups those imports use.
TEST(MatmulQuant, MatchesReferenceWithF16AndF32Scales) {
  uint32_t seed = 1000;
  for (ScaleType t : {ScaleType::F16, ScaleType::F32})
    for (auto [bits, group] : {std::pair{4, 32}, std::pair{5, 32}, std::pair{6, 16}, std::pair{8, 32}, std::pair{2, 64}})
      for (int T : {1, 5, 16})
        for (auto [rows, k] : {std::pair{1, 1}, std::pair{37, 3}, std::pair{131, 8}})
          check_case({bits, group, rows, group * k, T}, seed++, t);
}

// The MoE regroups tokens per expert: a token's output must not depend on its batch.
TEST(MatmulQuant, OutputBitsIndependentOfBatch) {
  const int T = 7;
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const int rows = 45, cols = 256, group = 64;
    std::mt19937 rng{uint32_t(bits)};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(size_t(rows) * cols), x(size_t(T) * cols);
    for (auto& v : w) v = normal(rng);
    for (auto& v : x) v = normal(rng);
    QuantBuffer qb = quantize(w.data(), rows, cols, bits, group);
    for (int64_t target : kernel_targets()) {
      hwy::SetSupportedTargetsForTest(target);
      std::vector<float> batch(size_t(T) * rows), one(static_cast<size_t>(rows));
      cpu::matmul_quant(x.data(), T, qb.view(), batch.data());
      for (int t = 0; t < T; ++t) {
        cpu::matmul_quant(x.data() + size_t(t) * cols, 1, qb.view(), one.data());
        for (int r = 0; r < rows; ++r)
          ASSERT_EQ(one[size_t(r)], batch[size_t(t) * rows + size_t(r)])
              << hwy::TargetName(target) << " bits " << bits << " t " << t << " r " << r;
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

// A batch (one parallel region for a layer's experts) gives each job matmul_quant's bits: jobs of
// mixed bits, groups, widths and token counts, some reading the same x, on every target.
TEST(MatmulQuant, BatchGivesEachJobItsOwnBits) {
  struct Shape {
    int bits, group, rows, cols, T, x;  // x: which input it reads
  };
  const Shape shapes[] = {{4, 64, 45, 256, 1, 0}, {4, 64, 37, 256, 1, 0}, {8, 64, 130, 256, 1, 0},
                          {3, 32, 19, 128, 1, 1}, {2, 128, 64, 256, 3, 2}, {8, 32, 3, 256, 3, 2},
                          {4, 64, 1000, 256, 1, 0}};
  std::mt19937 rng{7};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> xs{std::vector<float>(256), std::vector<float>(128), std::vector<float>(3 * 256)};
  for (auto& x : xs)
    for (auto& v : x) v = normal(rng);
  std::vector<QuantBuffer> weights;
  for (const Shape& sh : shapes) {
    std::vector<float> w(size_t(sh.rows) * size_t(sh.cols));
    for (auto& v : w) v = normal(rng);
    weights.push_back(quantize(w.data(), sh.rows, sh.cols, sh.bits, sh.group));
  }
  for (int64_t target : kernel_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    std::vector<std::vector<float>> batch, one;
    std::vector<cpu::QuantJob> jobs;
    for (size_t j = 0; j < std::size(shapes); ++j) {
      const Shape& sh = shapes[j];
      batch.emplace_back(size_t(sh.T) * size_t(sh.rows), -1.f);
      one.emplace_back(batch.back().size(), -2.f);
      cpu::matmul_quant(xs[size_t(sh.x)].data(), sh.T, weights[j].view(), one.back().data());
    }
    for (size_t j = 0; j < std::size(shapes); ++j)
      jobs.push_back({xs[size_t(shapes[j].x)].data(), shapes[j].T, weights[j].view(), batch[j].data()});
    cpu::matmul_quant_batch(jobs.data(), jobs.size());
    for (size_t j = 0; j < std::size(shapes); ++j)
      for (size_t i = 0; i < one[j].size(); ++i)
        ASSERT_EQ(batch[j][i], one[j][i]) << hwy::TargetName(target) << " job " << j << " at " << i;
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(MatmulQuant, LargeMatrixThreaded) {
  check_case({4, 64, 1000, 2048, 1}, 99);
  check_case({3, 32, 515, 1024, 3}, 100);
}

TEST(MatmulQuant, RejectsBadShapes) {
  QuantBuffer qb;
  qb.rows = 4, qb.cols = 96, qb.bits = 4, qb.group = 64;
  std::vector<float> x(96), y(4);
  EXPECT_THROW(cpu::matmul_quant(x.data(), 1, qb.view(), y.data()), Error);
  qb.cols = 128, qb.bits = 7;
  EXPECT_THROW(cpu::matmul_quant(x.data(), 1, qb.view(), y.data()), Error);
  qb.bits = 3, qb.group = 16;  // group 16 only with 4 or more bits
  EXPECT_THROW(cpu::matmul_quant(x.data(), 1, qb.view(), y.data()), Error);
  std::vector<float> w(4 * 128, 1.0f);
  QuantBuffer ok = quantize(w.data(), 4, 128, 4, 64);
  EXPECT_THROW(cpu::matmul_quant(x.data(), 0, ok.view(), y.data()), Error);
}

// The forward pass holds quantized weights as Mat; cpu::matmul must hand them to matmul_quant.
TEST(MatmulQuant, MatOfTypeAffineDispatchesToMatmulQuant) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(size_t(48) * 256), x(size_t(3) * 256);
  for (auto& v : w) v = 0.05f * normal(rng);
  for (auto& v : x) v = normal(rng);
  for (int bits : {2, 3, 4, 8}) {
    QuantBuffer qb = quantize(w.data(), 48, 256, bits, 64);
    const Mat m = Mat::affine(qb.view());
    ASSERT_EQ(m.type, WeightType::Affine);
    std::vector<float> want(3 * 48), got(3 * 48);
    cpu::matmul_quant(x.data(), 3, qb.view(), want.data());
    cpu::matmul(x.data(), 3, m, got.data());
    EXPECT_EQ(got, want) << bits << " bits";
  }
}

}  // namespace
}  // namespace ms
