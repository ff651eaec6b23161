// The Gated DeltaNet CUDA kernels against the CPU ones (kernels/cpu/deltanet.h), float32.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/deltanet.h"
#include "kernels/cuda/ops.h"

namespace ms::cuda::test {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

TEST(CudaDeltaNet, Conv1dSiluCarriesStateAcrossCalls) {
  MS_REQUIRE_CUDA();
  // Absolute, relative to max(1, |out|): K products summed in the same order, silu's expf.
  constexpr double kTol = 2e-6;
  Rng rng(9);
  struct Case {
    int T1, T2, C, K;
  };
  for (const Case& c : {Case{1, 1, 64, 4}, Case{7, 1, 8192, 4}, Case{33, 5, 100, 1}, Case{1, 2, 3, 6}, Case{2, 9, 300, 4}}) {
    const Vec w = rng.normals(size_t(c.C) * c.K, 0.5f);
    Vec st_cpu = rng.normals(size_t(c.C) * (c.K - 1));
    DeviceBuffer dw = dev(w), dst = dev(st_cpu);
    double err = 0;
    for (int T : {c.T1, c.T2}) {  // two calls: the second starts from the state the first left
      const Vec x = rng.normals(size_t(T) * c.C, 2.0f);
      Vec want(x.size());
      cpu::causal_conv1d_silu(x.data(), T, c.C, w.data(), c.K, st_cpu.data(), want.data());
      DeviceBuffer dx = dev(x), dout(x.size() * sizeof(float));
      causal_conv1d_silu(dx.as<float>(), T, c.C, dw.as<float>(), c.K, dst.as<float>(), dout.as<float>());
      const Vec got = host(dout);
      for (size_t i = 0; i < got.size(); ++i)
        err = std::max(err, std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(double(want[i]))));
      EXPECT_EQ(host(dst), st_cpu) << "state after " << T << " tokens";  // copies: exact
    }
    const std::string what = "T=" + std::to_string(c.T1) + "+" + std::to_string(c.T2) + " C=" + std::to_string(c.C) +
                             " K=" + std::to_string(c.K);
    record("conv1d_silu", what, err, kTol);
    EXPECT_LE(err, kTol) << what;
  }
}

// Inputs distributed as in a Qwen3-Next layer (as in the CPU tests): unit q and k, q scaled by
// 1/sqrt(dk); g = -exp(A_log)·softplus(a + dt_bias), a few nearly closed gates; beta = sigmoid(b).
TEST(CudaDeltaNet, GatedDeltaRuleMatchesRecurrence) {
  MS_REQUIRE_CUDA();
  // Absolute, relative to max(1, max|ref|) of output and state (the CPU kernels' own tolerance):
  // the same recurrence in the same order, FMA contraction aside.
  constexpr double kTol = 1e-5;
  struct Case {
    int T, hk, hv, dk, dv;
  };
  Rng rng(10);
  for (const Case& c : {Case{1, 2, 4, 128, 128}, Case{1, 16, 32, 128, 128}, Case{9, 1, 2, 64, 32},
                        Case{70, 2, 2, 32, 48}, Case{200, 2, 6, 128, 256}}) {
    auto unit_rows = [&](size_t rows, int dim, double scale) {
      Vec v = rng.normals(rows * dim);
      for (size_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += double(v[r * dim + i]) * v[r * dim + i];
        for (int i = 0; i < dim; ++i) v[r * dim + i] = float(v[r * dim + i] / std::sqrt(ss) * scale);
      }
      return v;
    };
    const Vec q = unit_rows(size_t(c.T) * c.hk, c.dk, 1.0 / std::sqrt(double(c.dk)));
    const Vec k = unit_rows(size_t(c.T) * c.hk, c.dk, 1.0);
    const Vec v = rng.normals(size_t(c.T) * c.hv * c.dv);
    Vec g(size_t(c.T) * c.hv), beta(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = float(-std::exp(rng.uniform(-3.0f, std::log(16.0f))) * softplus(rng.normal(2.0f)));
      if (rng.uniform(0, 1) < 0.03f) g[i] = -rng.uniform(20, 200);
      beta[i] = float(sigmoid(rng.normal(2.0f)));
    }
    Vec state = rng.normals(size_t(c.hv) * c.dk * c.dv, 0.5f), want(size_t(c.T) * c.hv * c.dv);
    DeviceBuffer dq = dev(q), dk = dev(k), dv = dev(v), dg = dev(g), db = dev(beta), dst = dev(state),
                 dout(want.size() * sizeof(float));
    cpu::gated_delta_rule_reference(q.data(), k.data(), v.data(), g.data(), beta.data(), c.T, c.hk, c.hv, c.dk, c.dv,
                                    state.data(), want.data());
    gated_delta_rule(dq.as<float>(), dk.as<float>(), dv.as<float>(), dg.as<float>(), db.as<float>(), c.T, c.hk, c.hv,
                     c.dk, c.dv, dst.as<float>(), dout.as<float>());
    const double out_err = max_abs_diff(host(dout), want) / std::max(1.0f, max_abs(want));
    const double st_err = max_abs_diff(host(dst), state) / std::max(1.0f, max_abs(state));
    const std::string what = "T=" + std::to_string(c.T) + " heads " + std::to_string(c.hk) + "/" +
                             std::to_string(c.hv) + " dk=" + std::to_string(c.dk) + " dv=" + std::to_string(c.dv);
    record("gated_delta_rule", what + " out", out_err, kTol);
    record("gated_delta_rule", what + " state", st_err, kTol);
    EXPECT_LE(out_err, kTol) << what;
    EXPECT_LE(st_err, kTol) << what;
  }
}

TEST(CudaDeltaNet, L2NormAndGatedRmsNorm) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-6;  // relative per element: both sum squares in double
  Rng rng(11);
  for (auto [rows, dim] : {std::pair{1, 128}, {64, 128}, {5, 2048}, {3, 77}}) {
    const Vec x = rng.normals(size_t(rows) * dim, 3.0f), z = rng.normals(x.size(), 2.0f),
              w = rng.normals(size_t(dim), 0.5f);
    Vec want_l2 = x, want_g(x.size());
    cpu::l2norm_heads(want_l2.data(), rows, dim, 1e-6f);
    cpu::rmsnorm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, want_g.data());
    DeviceBuffer dx = dev(x), dz = dev(z), dw = dev(w), dout(x.size() * sizeof(float));
    rmsnorm_gated(dx.as<float>(), dz.as<float>(), dw.as<float>(), rows, dim, 1e-6f, dout.as<float>());
    l2norm_heads(dx.as<float>(), rows, dim, 1e-6f);
    const std::string what = std::to_string(rows) + "x" + std::to_string(dim);
    double err_l2 = 0, err_g = 0;
    const Vec got_l2 = host(dx), got_g = host(dout);
    for (size_t i = 0; i < x.size(); ++i) {
      err_l2 = std::max(err_l2, std::abs(double(got_l2[i]) - want_l2[i]) / (std::abs(want_l2[i]) + 1e-30));
      err_g = std::max(err_g, std::abs(double(got_g[i]) - want_g[i]) / (std::abs(want_g[i]) + 1e-30));
    }
    record("l2norm_heads", what, err_l2, kTol);
    record("rmsnorm_gated", what, err_g, kTol);
    EXPECT_LE(err_l2, kTol) << what;
    EXPECT_LE(err_g, kTol) << what;
  }
}

}  // namespace
}  // namespace ms::cuda::test
