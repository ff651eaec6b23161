// cuda::matmul against cpu::matmul on the same weights. Tolerance per output: 1e-6 of the sum of
// the magnitudes of the terms both kernels round, Σ_c |x_c|·|w_c| for bf16 and
// Σ_c |x_c|·(|s·q_c| + |b|) for affine (both split the dot into s·Σq·x + b·Σx per group or
// chunk, which can cancel): float sums of up to 16k terms in different orders differ by well
// under that. The cuBLAS form (matmul_gemm, from gemm_min_tokens(W) tokens on) is held to the same
// tolerance: its SGEMM sums Σ_c x_c·w_c of the same dequantized w in yet another order.
// Seen on the H200: at most 7.5e-8 (bf16, 1000 x 4096, T = 512), 5.3e-8 between the two forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "quant_support.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "quant/affine.h"
#include "util/error.h"
#include "util/half.h"

namespace ms::cuda::test {
namespace {

constexpr double kTol = 1e-6;  // seen on the H200: at most 1.7e-7 (affine, x = 1 + 2^-9 + 2^-18)

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
  // T = 1 with rows of up to 2048 columns and no more rows than 16 a multiprocessor: the few-rows
  // kernel (the router's 513 x 2048, pycoder's 129 x 256); the others the staged one.
  const Shape shapes[] = {{1, 32, 1},      {7, 96, 1},      {129, 256, 1},  {512, 2048, 1},   {513, 2048, 1},
                          {2048, 2048, 1}, {3000, 1024, 1}, {40, 4096, 1},  {2048, 512, 3},   {300, 4096, 5},
                          {64, 8192, 9},   {1000, 12288, 2}, {40, 16384, 3}, {151, 2048, 64}};
  Rng rng(1);
  for (const Shape& s : shapes) {
    const Vec wf = rng.normals(size_t(s.rows) * s.cols, 0.05f), x = rng.normals(size_t(s.T) * s.cols);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
    Vec y_cpu(size_t(s.T) * s.rows);
    cpu::matmul(x.data(), s.T, Mat{WeightType::BF16, w.data(), s.rows, s.cols}, y_cpu.data());

    const DeviceArray<uint16_t> dw = DeviceArray<uint16_t>::from(w, DeviceAlloc::Now);
    DeviceArray<float> dx = dev(x), dy(y_cpu.size(), DeviceAlloc::Now);
    matmul(dx.data(), s.T, Mat{WeightType::BF16, dw.data(), s.rows, s.cols}, dy.data());
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
  // Rows past a 16-row tile and columns past a 128-column quad (7 x 192, 33 x 320, where the
  // group divides the columns) too; a last, partial lane block after whole ones (33 x 384 at q4
  // g32, 70 x 768 at q2 and q3 g128); more row sets than the grid has blocks (52000 x 1024); wide
  // blocks (matmul.cu's wide_blocks) at 4 bits, whole (2048 x 4096) and with a partial tile and
  // lane block (2000 x 4160), and at 2 and 3 bits (4000 x 4096).
  const Shape shapes[] = {{5, 128, 1},      {512, 2048, 1},  {129, 1024, 4},  {64, 4096, 7},   {2048, 512, 1},
                          {7, 192, 1},      {33, 320, 2},    {1000, 2048, 1}, {33, 384, 1},    {70, 768, 1},
                          {52000, 1024, 1}, {2048, 4096, 1}, {2000, 4160, 1}, {4000, 4096, 1}};
  Rng rng(2);
  for (int bits : {2, 3, 4, 8})
    for (int group : {32, 64, 128})
      for (const Shape& s : shapes) {
        if (s.cols % group != 0) continue;
        Vec wf = rng.normals(size_t(s.rows) * s.cols, 0.05f);
        for (auto& v : wf) v += 0.01f;
        const Vec x = rng.normals(size_t(s.T) * s.cols);
        const QuantBuffer qb = quantize(wf.data(), s.rows, s.cols, bits, group);
        Vec y_cpu(size_t(s.T) * s.rows);
        cpu::matmul(x.data(), s.T, Mat::affine(qb.view()), y_cpu.data());

        const DeviceArray<uint8_t> dq = DeviceArray<uint8_t>::from(qb.q, DeviceAlloc::Now);
        const DeviceArray<uint16_t> ds = DeviceArray<uint16_t>::from(qb.scales, DeviceAlloc::Now),
                                    db = DeviceArray<uint16_t>::from(qb.biases, DeviceAlloc::Now);
        DeviceArray<float> dx = dev(x), dy(y_cpu.size(), DeviceAlloc::Now);
        QuantMat qm = qb.view();
        qm.q = dq.data(), qm.scales = ds.data(), qm.biases = db.data();
        matmul(dx.data(), s.T, Mat::affine(qm), dy.data());
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

// mag[t, r] = Σ_c |x[t, c]|·a[r, c], a [rows, cols] the per-weight magnitudes of the file comment
// (float sums: only the scale of the tolerance).
std::vector<double> magnitudes(const Vec& x, int T, const Vec& a, int rows, int cols) {
  Vec ax(x.size()), m(size_t(T) * rows);
  for (size_t i = 0; i < x.size(); ++i) ax[i] = std::abs(x[i]);
  cpu::matmul(ax.data(), T, Mat{WeightType::F32, a.data(), rows, cols}, m.data());
  return {m.begin(), m.end()};
}

// A weight matrix on the host and the device, with a[r, c] for magnitudes().
struct TestWeights {
  Mat host, device;
  Vec a;
  DeviceArray<uint16_t> bf16;            // from bf16_weights
  DeviceArray<uint8_t> q;                // from affine_test_weights, with scales and biases
  DeviceArray<uint16_t> scales, biases;
};

TestWeights bf16_weights(Rng& rng, int rows, int cols, std::vector<uint16_t>& w) {
  const Vec wf = rng.normals(size_t(rows) * cols, 0.05f);
  w.resize(wf.size());
  TestWeights tw;
  tw.a.resize(wf.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]), tw.a[i] = std::abs(bf16_to_f32(w[i]));
  tw.bf16 = DeviceArray<uint16_t>::from(w, DeviceAlloc::Now);
  tw.host = Mat{WeightType::BF16, w.data(), rows, cols};
  tw.device = Mat{WeightType::BF16, tw.bf16.data(), rows, cols};
  return tw;
}

// The weights of host (any scale type) as TestWeights (its arrays must outlive them).
TestWeights affine_test_weights(const QuantMat& host) {
  const int rows = host.rows, cols = host.cols, group = host.group;
  TestWeights tw;
  tw.a.resize(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    float* ar = tw.a.data() + size_t(r) * cols;
    dequantize_row(host, r, ar);
    for (int c = 0; c < cols; ++c) {
      const float b = host.bias(size_t(r) * (cols / group) + c / group);
      ar[c] = std::abs(ar[c] - b) + std::abs(b);
    }
  }
  const size_t words = size_t(rows) * host.groups_per_row() * (scale_size(host.scale_type) / 2);
  tw.q = DeviceArray<uint8_t>::from(std::vector<uint8_t>(host.q, host.q + size_t(rows) * host.row_bytes()),
                                    DeviceAlloc::Now);
  tw.scales = DeviceArray<uint16_t>::from(std::vector<uint16_t>(host.scales, host.scales + words), DeviceAlloc::Now);
  tw.biases = DeviceArray<uint16_t>::from(std::vector<uint16_t>(host.biases, host.biases + words), DeviceAlloc::Now);
  tw.host = Mat::affine(host);
  QuantMat qm = host;
  qm.q = tw.q.data(), qm.scales = tw.scales.data(), qm.biases = tw.biases.data();
  tw.device = Mat::affine(qm);
  return tw;
}

TestWeights affine_test_weights(const QuantBuffer& qb) { return affine_test_weights(qb.view()); }

TestWeights affine_weights(Rng& rng, int rows, int cols, int bits, int group, QuantBuffer& qb) {
  Vec wf = rng.normals(size_t(rows) * cols, 0.05f);
  for (auto& v : wf) v += 0.01f;
  qb = quantize(wf.data(), rows, cols, bits, group);
  return affine_test_weights(qb);
}

// gate_up_silu (an MLP's gate and up in one launch) against the CPU's matmuls and silu_mul. Its
// error, divided by what first-order propagation of the matmuls' tolerance gives
// (|silu'(g)| <= 1.1 times mag_g·|u|, plus |silu(g)|·mag_u) plus |h| (expf's rounding), is held
// to kTol. The up matrix with bf16 scales and with f16 (each matrix reads its own scale type).
TEST(CudaMatmul, GateUpSiluMatchesCpu) {
  MS_REQUIRE_CUDA();
  const Shape shapes[] = {{512, 2048, 1}, {768, 2048, 1}, {33, 320, 1}, {7, 192, 1}, {2048, 512, 1}};
  Rng rng(12);
  for (ScaleType up_scales : {ScaleType::BF16, ScaleType::F16})
    for (int bits : {2, 3, 4, 8})
      for (int group : {32, 64})
        for (const Shape& s : shapes) {
          if (s.cols % group != 0) continue;
          QuantBuffer qg, qu;
          const TestWeights gate = affine_weights(rng, s.rows, s.cols, bits, group, qg);
          TestWeights up = affine_weights(rng, s.rows, s.cols, bits, group, qu);
          ::ms::test::TypedScales typed;
          if (up_scales != ScaleType::BF16) {
            typed = ::ms::test::with_scale_type(qu, up_scales, rng.gen);
            up = affine_test_weights(typed.view);
          }
          ASSERT_TRUE(gate_up_fuses(gate.device, up.device, 1));
          const Vec x = rng.normals(size_t(s.cols));
          Vec g(size_t(s.rows)), u(g.size()), want(g.size());
          cpu::matmul(x.data(), 1, gate.host, g.data());
          cpu::matmul(x.data(), 1, up.host, u.data());
          cpu::silu_mul(g.data(), u.data(), want.data(), int64_t(g.size()));
          DeviceArray<float> dx = dev(x), dh(want.size(), DeviceAlloc::Now);
          gate_up_silu(dx.data(), gate.device, up.device, dh.data());
          const Vec h = host(dh);
          const std::vector<double> mag_g = magnitudes(x, 1, gate.a, s.rows, s.cols),
                                    mag_u = magnitudes(x, 1, up.a, s.rows, s.cols);
          double err = 0;
          for (size_t r = 0; r < h.size(); ++r) {
            const double silu = double(g[r]) / (1.0 + std::exp(-double(g[r])));
            const double bound = 1.1 * mag_g[r] * std::abs(u[r]) + std::abs(silu) * mag_u[r] + std::abs(want[r]);
            err = std::max(err, std::abs(double(h[r]) - want[r]) / (bound + 1e-30));
          }
          const std::string what = "q" + std::to_string(bits) + " g" + std::to_string(group) + " up " +
                                   scale_type_name(up_scales) + " " + name(s);
          record("gate_up_silu", what, err, kTol);
          EXPECT_LE(err, kTol) << what;
        }
}

// The affine kernel multiplies byte codes by x in 30-bit integer form per chunk of 32 (four signed
// bytes) on the tensor cores. x = 1 + 2^-9 + 2^-18 needs 19 bits: a form of 16 bits (two bytes,
// or two bf16 parts) would lose 2^-18 of every term, and with all terms positive the outputs would
// be 3.8e-6 low, over kTol.
TEST(CudaMatmul, AffineKeepsEveryBitOfX) {
  MS_REQUIRE_CUDA();
  Rng rng(9);
  const int rows = 300, cols = 2048;
  for (int bits : {2, 3, 4})
    for (int T : {1, 4}) {
      const Vec wf = rng.normals(size_t(rows) * cols, 0.05f);
      QuantBuffer qb = quantize(wf.data(), rows, cols, bits, 64);
      std::fill(qb.biases.begin(), qb.biases.end(), f32_to_bf16(0.25f));  // scales ≥ 0: every weight ≥ 0.25
      const TestWeights tw = affine_test_weights(qb);
      const Vec x(size_t(T) * cols, 1.0f + 0x1p-9f + 0x1p-18f);
      Vec y_cpu(size_t(T) * rows);
      cpu::matmul(x.data(), T, tw.host, y_cpu.data());
      DeviceArray<float> dx = dev(x), dy(y_cpu.size(), DeviceAlloc::Now);
      matmul(dx.data(), T, tw.device, dy.data());
      const std::string what = "q" + std::to_string(bits) + " T=" + std::to_string(T);
      const double err = rel_error(host(dy), y_cpu, magnitudes(x, T, tw.a, rows, cols));
      record("matmul affine, x = 1 + 2^-9 + 2^-18", what, err, kTol);
      EXPECT_LE(err, kTol) << what;
    }
}

// A chunk of x whose values span seven orders of magnitude (one 1e4, the rest ±1e-3 and 0): its
// integer form keeps the small ones to 2^-31 of the large one. Dropping them would be 3e-6 off.
TEST(CudaMatmul, AffineKeepsSmallValuesBesideLargeOnes) {
  MS_REQUIRE_CUDA();
  Rng rng(10);
  const int rows = 200, cols = 1024;
  for (int bits : {2, 3, 4, 8}) {
    QuantBuffer qb;
    const TestWeights tw = affine_weights(rng, rows, cols, bits, 64, qb);
    Vec x(static_cast<size_t>(cols), 0.f);
    for (int c = 0; c < cols; ++c) x[size_t(c)] = c % 32 == 5 ? 1e4f : c % 3 == 0 ? 0.f : rng.uniform(-1e-3f, 1e-3f);
    Vec y_cpu(static_cast<size_t>(rows), 0.f);
    cpu::matmul(x.data(), 1, tw.host, y_cpu.data());
    DeviceArray<float> dx = dev(x), dy(y_cpu.size(), DeviceAlloc::Now);
    matmul(dx.data(), 1, tw.device, dy.data());
    const std::string what = "q" + std::to_string(bits);
    const double err = rel_error(host(dy), y_cpu, magnitudes(x, 1, tw.a, rows, cols));
    record("matmul affine, x of 1e4 and 1e-3", what, err, kTol);
    EXPECT_LE(err, kTol) << what;
  }
}

// x of every size from 2^-90 to 2^100 (products stay normal floats on the CPU): each unit's power
// of two comes from the exponent bits of its largest value and is applied as two halves, which
// must hold at both ends.
TEST(CudaMatmul, AffineMatchesCpuAcrossExponents) {
  MS_REQUIRE_CUDA();
  Rng rng(13);
  const int rows = 96, cols = 1024;
  for (int bits : {2, 3, 4, 8})
    for (int group : {32, 64}) {
      QuantBuffer qb;
      const TestWeights tw = affine_weights(rng, rows, cols, bits, group, qb);
      for (int e : {-90, -60, -20, 0, 20, 60, 100}) {
        Vec x = rng.normals(size_t(cols));
        for (float& v : x) v = std::ldexp(v, e);
        Vec y_cpu(static_cast<size_t>(rows));
        cpu::matmul(x.data(), 1, tw.host, y_cpu.data());
        DeviceArray<float> dx = dev(x), dy(y_cpu.size(), DeviceAlloc::Now);
        matmul(dx.data(), 1, tw.device, dy.data());
        const std::string what = "q" + std::to_string(bits) + " g" + std::to_string(group) + " 2^" + std::to_string(e);
        const double err = rel_error(host(dy), y_cpu, magnitudes(x, 1, tw.a, rows, cols));
        record("matmul affine, x of 2^-90 to 2^100", what, err, kTol);
        EXPECT_LE(err, kTol) << what;
      }
    }
}

// A NaN or an infinity in x makes every output NaN (on the CPU NaN or infinite).
TEST(CudaMatmul, AffineCarriesNaNAndInfinity) {
  MS_REQUIRE_CUDA();
  Rng rng(11);
  QuantBuffer qb;
  const TestWeights tw = affine_weights(rng, 40, 256, 4, 64, qb);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    Vec x = rng.normals(256);
    x[77] = bad;
    DeviceArray<float> dx = dev(x), dy(40, DeviceAlloc::Now);
    matmul(dx.data(), 1, tw.device, dy.data());
    for (float v : host(dy)) EXPECT_TRUE(std::isnan(v)) << "x[77] = " << bad;
  }
}

// Back-to-back calls start overlapped (launch_overlapped): each must still read all of the output
// of the call before it, and must not write over that call's input before it is done. Three calls
// over two buffers, each reading the last one's output and writing over its input (the second
// starting as NaN, so that reading it early shows), against the same chain on the CPU. The bound
// propagates: after step k the error is at most A·e_{k-1} + kTol·A·|y_{k-1}| (A = |W| per weight,
// as magnitudes()); an early read or write is off by the size of the values themselves.
TEST(CudaMatmul, ChainedCallsWaitForEachOther) {
  MS_REQUIRE_CUDA();
  Rng rng(12);
  for (const auto& [n, bf16] : {std::pair{512, false}, std::pair{4096, false}, std::pair{512, true}, std::pair{2048, true}}) {
    QuantBuffer qb;
    std::vector<uint16_t> w;
    const TestWeights tw = bf16 ? bf16_weights(rng, n, n, w) : affine_weights(rng, n, n, 4, 64, qb);
    Vec y = rng.normals(size_t(n)), next = y;
    DeviceArray<float> a = dev(y), b = dev(Vec(size_t(n), NAN));
    // All three queued before the host does anything else, so that each can start while the one
    // before runs.
    for (int step = 0; step < 3; ++step)
      matmul((step % 2 ? b : a).data(), 1, tw.device, (step % 2 ? a : b).data());
    std::vector<double> bound(size_t(n), 0.0);
    for (int step = 0; step < 3; ++step) {
      Vec e(bound.begin(), bound.end());
      const std::vector<double> carried = magnitudes(e, 1, tw.a, n, n), mag = magnitudes(y, 1, tw.a, n, n);
      for (size_t r = 0; r < bound.size(); ++r) bound[r] = carried[r] + kTol * mag[r];
      cpu::matmul(y.data(), 1, tw.host, next.data());
      y.swap(next);
    }
    const Vec got = host(b);
    double err = 0;
    for (size_t r = 0; r < got.size(); ++r) {
      const double e = std::abs(double(got[r]) - y[r]) / (bound[r] + 1e-30);
      err = std::max(err, std::isnan(e) ? INFINITY : e);
    }
    const std::string what = std::to_string(n) + "x" + std::to_string(n) + ", 3 chained calls (err/bound)";
    record(bf16 ? "matmul bf16" : "matmul affine", what, err, 1.0);
    EXPECT_LE(err, 1.0) << what;
  }
}

// matmul_gemm against cpu::matmul for each T, tiles of tile_rows rows (0: the default scratch).
void check_gemm(const std::string& kernel, const std::string& what, const TestWeights& tw, int tile_rows, Rng& rng) {
  const int rows = tw.host.rows, cols = tw.host.cols;
  const size_t scratch = tile_rows ? size_t(tile_rows) * cols * sizeof(float) : kGemmScratchBytes;
  for (int T : {gemm_min_tokens(tw.host), 33, 200, 512}) {
    const Vec x = rng.normals(size_t(T) * cols);
    Vec y_cpu(size_t(T) * rows);
    cpu::matmul(x.data(), T, tw.host, y_cpu.data());
    DeviceArray<float> dx = dev(x), dy(y_cpu.size(), DeviceAlloc::Now);
    matmul_gemm(dx.data(), T, tw.device, dy.data(), scratch);
    const std::string name = what + " " + std::to_string(rows) + "x" + std::to_string(cols) + " T=" +
                             std::to_string(T) + " tile " + std::to_string(tile_rows ? tile_rows : rows);
    const double err = rel_error(host(dy), y_cpu, magnitudes(x, T, tw.a, rows, cols));
    record(kernel, name, err, kTol);
    EXPECT_LE(err, kTol) << name;
  }
}

struct GemmShape {
  int rows, cols, tile_rows;  // tile_rows 0: the default scratch (one tile for these)
};

// float32 weights (a GGUF's routers, which llama.cpp keeps in f32): the float kernel at T = 1 and
// in batches, and the cuBLAS form on the weights as they are.
TEST(CudaMatmul, F32MatchesCpu) {
  MS_REQUIRE_CUDA();
  const Shape shapes[] = {{512, 2048, 1}, {1, 2048, 1}, {129, 256, 3}, {300, 1024, 40}, {64, 4096, 7}};
  Rng rng(7);
  for (const Shape& s : shapes) {
    const Vec w = rng.normals(size_t(s.rows) * s.cols, 0.05f), x = rng.normals(size_t(s.T) * s.cols);
    Vec y_cpu(size_t(s.T) * s.rows);
    cpu::matmul(x.data(), s.T, Mat{WeightType::F32, w.data(), s.rows, s.cols}, y_cpu.data());
    DeviceArray<float> dw = dev(w), dx = dev(x), dy(y_cpu.size(), DeviceAlloc::Now);
    matmul(dx.data(), s.T, Mat{WeightType::F32, dw.data(), s.rows, s.cols}, dy.data());
    Vec a(w.size());
    for (size_t i = 0; i < w.size(); ++i) a[i] = std::abs(w[i]);
    const double err = rel_error(host(dy), y_cpu, magnitudes(x, s.T, a, s.rows, s.cols));
    record("matmul f32", name(s), err, kTol);
    EXPECT_LE(err, kTol) << name(s);
  }
}

TEST(CudaMatmul, GemmBf16MatchesCpu) {
  MS_REQUIRE_CUDA();
  const GemmShape shapes[] = {{300, 1024, 96}, {151, 2048, 64}, {1000, 4096, 0}, {64, 8192, 0}};
  Rng rng(3);
  for (const GemmShape& s : shapes) {
    std::vector<uint16_t> w;
    const TestWeights tw = bf16_weights(rng, s.rows, s.cols, w);
    check_gemm("matmul_gemm bf16", "bf16", tw, s.tile_rows, rng);
  }
}

TEST(CudaMatmul, GemmAffineMatchesCpu) {
  MS_REQUIRE_CUDA();
  const GemmShape shapes[] = {{300, 1024, 96}, {129, 2048, 40}, {512, 4096, 0}};
  const int groups[] = {32, 64, 128};
  Rng rng(4);
  for (int bits : {2, 3, 4, 8})
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const GemmShape& s = shapes[i];
      const int group = groups[(i + size_t(bits)) % 3];
      QuantBuffer qb;
      const TestWeights tw = affine_weights(rng, s.rows, s.cols, bits, group, qb);
      check_gemm("matmul_gemm affine", "q" + std::to_string(bits) + " g" + std::to_string(group), tw, s.tile_rows,
                 rng);
    }
}

// The layouts of GGUF and MLX imports: f16 scales (nudged off the bf16 grid: quant_support.h) on
// the tensor cores; f32 scales, 5 and 6 bits and groups of 16 on the float kernel
// (tensor_core_layout). Each at T = 1, in batches of tokens and on the cuBLAS form.
TEST(CudaMatmul, ImportedLayoutsMatchCpu) {
  MS_REQUIRE_CUDA();
  struct Layout {
    int bits, group;
    ScaleType scales;
  };
  const Layout layouts[] = {{4, 32, ScaleType::F16}, {8, 32, ScaleType::F16}, {5, 32, ScaleType::F16},
                            {4, 32, ScaleType::F32}, {5, 32, ScaleType::F32}, {6, 16, ScaleType::F32},
                            {2, 64, ScaleType::F16}, {3, 128, ScaleType::F32}, {6, 32, ScaleType::BF16},
                            {4, 16, ScaleType::BF16}};
  // Partial row sets and lane splits (5 x 128, 33 x 384, 2000 x 4160), batches (T = 3, 7), wide
  // rows (64 x 8192) and the cuBLAS form (T = 130).
  const Shape shapes[] = {{5, 128, 1},  {512, 2048, 1}, {129, 1024, 3}, {33, 384, 1},
                          {2000, 4160, 1}, {64, 8192, 7}, {300, 1024, 130}};
  Rng rng(6);
  for (const Layout& l : layouts)
    for (const Shape& s : shapes) {
      if (s.cols % l.group != 0) continue;
      Vec wf = rng.normals(size_t(s.rows) * s.cols, 0.05f);
      for (auto& v : wf) v += 0.01f;
      const QuantBuffer qb = quantize(wf.data(), s.rows, s.cols, l.bits, l.group);
      const ::ms::test::TypedScales typed = ::ms::test::with_scale_type(qb, l.scales, rng.gen);
      const TestWeights tw = affine_test_weights(typed.view);
      const Vec x = rng.normals(size_t(s.T) * s.cols);
      Vec y_cpu(size_t(s.T) * s.rows);
      cpu::matmul(x.data(), s.T, tw.host, y_cpu.data());
      DeviceArray<float> dx = dev(x), dy(y_cpu.size(), DeviceAlloc::Now);
      matmul(dx.data(), s.T, tw.device, dy.data());
      const std::string what = "q" + std::to_string(l.bits) + " g" + std::to_string(l.group) + " " +
                               scale_type_name(l.scales) + " " + name(s);
      const double err = rel_error(host(dy), y_cpu, magnitudes(x, s.T, tw.a, s.rows, s.cols));
      record("matmul imported", what, err, kTol);
      EXPECT_LE(err, kTol) << what;
    }
}

// Around the threshold the two forms agree within the tolerance, and matmul is bit for bit the
// form it picks (each deterministic).
TEST(CudaMatmul, FormsAgreeAroundThreshold) {
  MS_REQUIRE_CUDA();
  Rng rng(5);
  std::vector<uint16_t> w;
  QuantBuffer qb;
  // 3-bit affine: the integer GEMM (int_gemm.h) takes 4 and 8 bits before this threshold.
  const TestWeights cases[] = {bf16_weights(rng, 1000, 4096, w), affine_weights(rng, 1000, 4096, 3, 64, qb)};
  for (const TestWeights& tw : cases)
    for (int T : {gemm_min_tokens(tw.host) - 1, gemm_min_tokens(tw.host), gemm_min_tokens(tw.host) + 1}) {
      const int rows = tw.host.rows, cols = tw.host.cols;
      const Vec x = rng.normals(size_t(T) * cols);
      DeviceArray<float> dx = dev(x), d_direct(size_t(T) * rows, DeviceAlloc::Now), d_gemm(size_t(T) * rows, DeviceAlloc::Now),
                         d_matmul(size_t(T) * rows, DeviceAlloc::Now);
      matmul_direct(dx.data(), T, tw.device, d_direct.data());
      matmul_gemm(dx.data(), T, tw.device, d_gemm.data());
      matmul(dx.data(), T, tw.device, d_matmul.data());
      const Vec y_direct = host(d_direct), y_gemm = host(d_gemm), y = host(d_matmul);
      const std::string name = std::string(tw.host.type == WeightType::BF16 ? "bf16" : "q3 g64") + " 1000x4096 T=" +
                               std::to_string(T);
      const double err = rel_error(y_gemm, y_direct, magnitudes(x, T, tw.a, rows, cols));
      record("matmul gemm-direct", name, err, kTol);
      EXPECT_LE(err, kTol) << name;
      EXPECT_EQ(y, T >= gemm_min_tokens(tw.host) ? y_gemm : y_direct) << name;
    }
}

TEST(CudaMatmul, RejectsWhatItCannotRun) {
  MS_REQUIRE_CUDA();
  const DeviceArray<unsigned char> buf(1 << 16, DeviceAlloc::Now);  // untyped: read as floats and as scales
  const float* x = reinterpret_cast<const float*>(buf.data());
  float* y = reinterpret_cast<float*>(buf.data());
  const uint16_t* sb = reinterpret_cast<const uint16_t*>(buf.data());
  EXPECT_THROW(matmul(x, 1, Mat{WeightType::BF16, buf.data(), 4, 48}, y), Error);   // cols % 32
  EXPECT_THROW(matmul(x + 1, 1, Mat{WeightType::BF16, buf.data(), 4, 64}, y), Error);  // misaligned x
  for (int T : {kGemmMinTokensBf16, kGemmMinTokensAffine}) {  // the cuBLAS form checks alike
    EXPECT_THROW(matmul(x, T, Mat{WeightType::BF16, buf.data(), 4, 48}, y), Error);
    EXPECT_THROW(matmul(x + 1, T, Mat{WeightType::BF16, buf.data(), 4, 64}, y), Error);
    EXPECT_THROW(matmul(x, T, Mat{WeightType::Affine, buf.data(), 4, 64, 4, 48, sb, sb}, y),
                 Error);  // group 48
  }
  // Rows too wide for the staging of x in shared memory, for either kernel (the buffer would hold
  // what a kernel reads, should one run).
  const DeviceArray<unsigned char> wide(size_t(4) << 20, DeviceAlloc::Now);
  float* xw = reinterpret_cast<float*>(wide.data());
  const uint16_t* wsb = reinterpret_cast<const uint16_t*>(wide.data());
  const Mat affine{WeightType::Affine, wide.data(), 1, 1 << 20, 4, 64, wsb, wsb};
  EXPECT_THROW(matmul(xw, 1, affine, xw), Error);
  EXPECT_THROW(matmul(xw, 1, Mat{WeightType::BF16, wide.data(), 1, 1 << 20}, xw), Error);
}

}  // namespace
}  // namespace ms::cuda::test
