// cuda::matmul against cpu::matmul on the same weights. Tolerance per output: 1e-6 of the sum of
// the magnitudes of the terms both kernels round, Σ_c |x_c|·|w_c| for bf16 and
// Σ_c |x_c|·(|s·q_c| + |b|) for affine (both split the dot into s·Σq·x + b·Σx per group or
// chunk, which can cancel): float sums of up to 16k terms in different orders differ by well
// under that.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "quant/affine.h"
#include "util/error.h"
#include "util/half.h"

namespace ms::cuda::test {
namespace {

constexpr double kTol = 1e-6;  // seen on the H200: at most 5e-8

struct Shape {
  int rows, cols, T;
};

std::string name(const Shape& s) {
  return std::to_string(s.rows) + "x" + std::to_string(s.cols) + " T=" + std::to_string(s.T);
}

// Max over outputs of |gpu - cpu| / mag, mag[t, r] as in the file comment.
double rel_error(const Vec& gpu, const Vec& cpu, const std::vector<double>& mag) {
  double m = 0;
  for (size_t i = 0; i < gpu.size(); ++i) m = std::max(m, std::abs(double(gpu[i]) - cpu[i]) / (mag[i] + 1e-30));
  return m;
}

TEST(CudaMatmul, Bf16MatchesCpu) {
  MS_REQUIRE_CUDA();
  const Shape shapes[] = {{1, 32, 1},     {7, 96, 1},     {512, 2048, 1}, {2048, 512, 3},  {300, 4096, 5},
                          {64, 8192, 9},  {1000, 12288, 2}, {40, 16384, 3}, {151, 2048, 64}};
  Rng rng(1);
  for (const Shape& s : shapes) {
    const Vec wf = rng.normals(size_t(s.rows) * s.cols, 0.05f), x = rng.normals(size_t(s.T) * s.cols);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
    Vec y_cpu(size_t(s.T) * s.rows);
    cpu::matmul(x.data(), s.T, Mat{WeightType::BF16, w.data(), s.rows, s.cols}, y_cpu.data());

    DeviceBuffer dw = DeviceBuffer::from(w), dx = dev(x), dy(y_cpu.size() * sizeof(float));
    matmul(dx.as<float>(), s.T, Mat{WeightType::BF16, dw.data(), s.rows, s.cols}, dy.as<float>());
    const Vec y = host(dy);

    std::vector<double> mag(y.size(), 0.0);
    for (int t = 0; t < s.T; ++t)
      for (int r = 0; r < s.rows; ++r)
        for (int c = 0; c < s.cols; ++c)
          mag[size_t(t) * s.rows + r] +=
              std::abs(double(x[size_t(t) * s.cols + c]) * bf16_to_f32(w[size_t(r) * s.cols + c]));
    const double err = rel_error(y, y_cpu, mag);
    record("matmul bf16", name(s), err, kTol);
    EXPECT_LE(err, kTol) << name(s);
  }
}

TEST(CudaMatmul, AffineMatchesCpu) {
  MS_REQUIRE_CUDA();
  const Shape shapes[] = {{5, 128, 1}, {512, 2048, 1}, {129, 1024, 4}, {64, 4096, 7}, {2048, 512, 1}};
  Rng rng(2);
  for (int bits : {2, 3, 4, 8})
    for (int group : {32, 64, 128})
      for (const Shape& s : shapes) {
        Vec wf = rng.normals(size_t(s.rows) * s.cols, 0.05f);
        for (auto& v : wf) v += 0.01f;
        const Vec x = rng.normals(size_t(s.T) * s.cols);
        const QuantBuffer qb = quantize(wf.data(), s.rows, s.cols, bits, group);
        Vec y_cpu(size_t(s.T) * s.rows);
        cpu::matmul(x.data(), s.T, Mat::affine(qb.view()), y_cpu.data());

        DeviceBuffer dq = DeviceBuffer::from(qb.q), ds = DeviceBuffer::from(qb.scales),
                     db = DeviceBuffer::from(qb.biases), dx = dev(x), dy(y_cpu.size() * sizeof(float));
        QuantMat qm = qb.view();
        qm.q = dq.as<uint8_t>(), qm.scales = ds.as<uint16_t>(), qm.biases = db.as<uint16_t>();
        matmul(dx.as<float>(), s.T, Mat::affine(qm), dy.as<float>());
        const Vec y = host(dy);

        std::vector<double> mag(y.size(), 0.0);
        Vec w(size_t(s.cols));
        for (int r = 0; r < s.rows; ++r) {
          dequantize_row(qb.view(), r, w.data());
          for (int c = 0; c < s.cols; ++c) {
            const double b = bf16_to_f32(qb.biases[size_t(r) * (s.cols / group) + c / group]);
            for (int t = 0; t < s.T; ++t)
              mag[size_t(t) * s.rows + r] +=
                  std::abs(double(x[size_t(t) * s.cols + c])) * (std::abs(w[size_t(c)] - b) + std::abs(b));
          }
        }
        const std::string what = "q" + std::to_string(bits) + " g" + std::to_string(group) + " " + name(s);
        const double err = rel_error(y, y_cpu, mag);
        record("matmul affine", what, err, kTol);
        EXPECT_LE(err, kTol) << what;
      }
}

TEST(CudaMatmul, RejectsWhatItCannotRun) {
  MS_REQUIRE_CUDA();
  DeviceBuffer buf(1 << 16);
  const float* x = buf.as<float>();
  float* y = buf.as<float>();
  EXPECT_THROW(matmul(x, 1, Mat{WeightType::BF16, buf.data(), 4, 48}, y), Error);   // cols % 32
  EXPECT_THROW(matmul(x, 1, Mat{WeightType::F32, buf.data(), 4, 64}, y), Error);    // f32 weights
  EXPECT_THROW(matmul(x + 1, 1, Mat{WeightType::BF16, buf.data(), 4, 64}, y), Error);  // misaligned x
}

}  // namespace
}  // namespace ms::cuda::test
