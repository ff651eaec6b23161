// The Gated DeltaNet CUDA kernels against the CPU ones (kernels/cpu/deltanet.h), float32.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/deltanet_case.h"
#include "kernels/cpu/deltanet.h"
#include "kernels/cuda/deltanet.h"
#include "kernels/cuda/ops.h"
#include "util/error.h"

namespace ms::cuda::test {
namespace {

using ms::test::DeltaCase;
using ms::test::make_delta_case;

struct DeltaResult {
  Vec out, state;
};

using DeltaFn = void (*)(const float*, const float*, const float*, const float*, const float*, int, int, int, int,
                         int, float*, float*);

// Runs a CUDA form on tokens split into calls of the given sizes (one call: {T}), the state
// carried from call to call on the device.
DeltaResult run_cuda(DeltaFn fn, const DeltaCase& c, const std::vector<int>& pieces) {
  DeviceArray<float> dq = dev(c.q), dk = dev(c.k), dv = dev(c.v), dg = dev(c.g), db = dev(c.beta), dst = dev(c.state),
                     dout(size_t(c.T) * c.hv * c.dv, DeviceAlloc::Now);
  int t0 = 0;
  for (int n : pieces) {
    const size_t qk = size_t(t0) * c.hk * c.dk, vo = size_t(t0) * c.hv * c.dv, gb = size_t(t0) * c.hv;
    fn(dq.data() + qk, dk.data() + qk, dv.data() + vo, dg.data() + gb, db.data() + gb, n,
       c.hk, c.hv, c.dk, c.dv, dst.data(), dout.data() + vo);
    t0 += n;
  }
  return {host(dout), host(dst)};
}

DeltaResult run_cpu(DeltaFn fn, const DeltaCase& c) {
  DeltaResult r{Vec(size_t(c.T) * c.hv * c.dv), c.state};
  fn(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.hk, c.hv, c.dk, c.dv, r.state.data(),
     r.out.data());
  return r;
}

// Records and checks the larger of the output's and the state's error, each absolute relative to
// max(1, max|want|) of that quantity (the CPU tests' measure).
void expect_close(const DeltaResult& got, const DeltaResult& want, const std::string& kernel, const std::string& what,
                  double tol) {
  const double out_err = max_abs_diff(got.out, want.out) / std::max(1.0f, max_abs(want.out));
  const double st_err = max_abs_diff(got.state, want.state) / std::max(1.0f, max_abs(want.state));
  record(kernel, what + " out", out_err, tol);
  record(kernel, what + " state", st_err, tol);
  EXPECT_LE(out_err, tol) << kernel << " " << what << ": output";
  EXPECT_LE(st_err, tol) << kernel << " " << what << ": final state";
}

TEST(CudaDeltaNet, GatedDeltaRuleMatchesRecurrence) {
  MS_REQUIRE_CUDA();
  // The recurrent kernel, for any T (gated_delta_rule takes it for short T only). Absolute,
  // relative to max(1, max|ref|) of output and state (the CPU kernels' own tolerance): the same
  // recurrence in the same order, FMA contraction aside.
  constexpr double kTol = 1e-5;
  struct Case {
    int T, hk, hv, dk, dv;
  };
  Rng rng(10);
  for (const Case& s : {Case{1, 2, 4, 128, 128}, Case{1, 16, 32, 128, 128}, Case{9, 1, 2, 64, 32},
                        Case{70, 2, 2, 32, 48}, Case{200, 2, 6, 128, 256}, Case{3, 1, 2, 300, 40}}) {
    const DeltaCase c = make_delta_case(rng, s.T, s.hk, s.hv, s.dk, s.dv, true);
    expect_close(run_cuda(gated_delta_rule_recurrent, c, {c.T}), run_cpu(cpu::gated_delta_rule_reference, c),
                 "delta recurrent", c.name(), kTol);
  }
}

// The chunked kernel against the token-by-token reference and against the CPU's chunked kernel.
// Tolerance 1e-5, absolute relative to max(1, max|want|) of output and state: the CPU test's
// chunked-vs-reference tolerance (tests/kernels/cpu/deltanet_test.cpp, kRelTol), for the same
// reason. Every form is a contraction (|k| = 1, beta < 1, decay <= 1) of O(1) values, each value
// a sum of at most dk + 64 float32 products, so reassociating the sums (the GPU solves (I + A)
// by forward substitution where the CPU multiplies by its inverse, forms o as (gamma q - P W) S +
// P U and folds the end-of-chunk decay into u) moves results by float32 rounding (~1e-7 on the
// CPU's measure against a double recurrence), and the error does not grow with T; a wrong decay,
// mask or solve term errs by 1e-3 and more.
TEST(CudaDeltaNet, ChunkedGatedDeltaRuleMatchesCpu) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-5;
  struct Shape {
    int hk, hv, dk, dv;
  };
  Rng rng(12);
  // Qwen3-Next's (16 key, 32 value heads of 128), equal key and value heads, grouped small heads,
  // dv wider than dk and not a multiple of the kernel's 32 state columns.
  for (const Shape& s : {Shape{16, 32, 128, 128}, Shape{2, 2, 32, 48}, Shape{1, 3, 64, 32}, Shape{2, 4, 128, 256},
                         Shape{4, 4, 64, 64}})
    for (int T : {2, 63, 64, 65, 200, 1000}) {
      const bool random_state = T != 64;  // one zero start per shape, as at a sequence's first prompt
      const DeltaCase c = make_delta_case(rng, T, s.hk, s.hv, s.dk, s.dv, random_state);
      const DeltaResult got = run_cuda(gated_delta_rule_chunked, c, {c.T});
      const std::string what = c.name() + (random_state ? "" : " S0=0");
      expect_close(got, run_cpu(cpu::gated_delta_rule_reference, c), "chunked vs ref", what, kTol);
      expect_close(got, run_cpu(cpu::gated_delta_rule, c), "chunked vs cpu", what, kTol);
    }
}

// A prompt fed in pieces (prefill chunks of any length, then single decode tokens) through
// gated_delta_rule, which picks the recurrent or the chunked kernel by piece length, continues
// from the carried state as one chunked call would. Same tolerance and reasoning as above: the
// pieces only move chunk boundaries, i.e. the order of float32 sums.
TEST(CudaDeltaNet, GatedDeltaRuleSplitCallsMatchOneCall) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-5;
  Rng rng(13);
  for (const DeltaCase& c : {make_delta_case(rng, 1000, 16, 32, 128, 128, true),
                             make_delta_case(rng, 300, 2, 4, 64, 32, true)}) {
    const DeltaResult whole = run_cuda(gated_delta_rule_chunked, c, {c.T});
    const int T = c.T;
    for (const std::vector<int>& pieces :
         std::vector<std::vector<int>>{{T / 2, T - T / 2}, {64, 128, T - 192}, {1, T - 1}, {70, 1, 1, 1, 1, 1, T - 75},
                                       {100, 5, 17, 31, T - 153}, {T - 3, 1, 1, 1}}) {
      std::string what = c.name() + " pieces";
      for (int n : pieces) what += " " + std::to_string(n);
      expect_close(run_cuda(gated_delta_rule, c, pieces), whole, "split vs whole", what, kTol);
    }
  }
}

// Head sizes the chunked kernel does not take (not multiples of 4) go to the recurrent one.
TEST(CudaDeltaNet, GatedDeltaRuleFallsBackToRecurrence) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-5;  // the recurrence's, as GatedDeltaRuleMatchesRecurrence
  Rng rng(14);
  const DeltaCase c = make_delta_case(rng, 100, 1, 2, 6, 10, true);
  DeviceArray<float> dk = dev(c.k), dst = dev(c.state), dout(size_t(c.T) * c.hv * c.dv, DeviceAlloc::Now);
  EXPECT_FALSE(chunked_delta_rule_fits(dk.data(), c.dk, c.dv, dst.data(), dout.data()));
  EXPECT_THROW(gated_delta_rule_chunked(dk.data(), dk.data(), dk.data(), dk.data(),
                                        dk.data(), 1, c.hk, c.hv, c.dk, c.dv, dst.data(), dout.data()),
               Error);
  expect_close(run_cuda(gated_delta_rule, c, {c.T}), run_cpu(cpu::gated_delta_rule_reference, c), "fallback",
               c.name(), kTol);
}

TEST(CudaDeltaNet, GatedRmsNorm) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-6;  // relative per element: both sum squares in double
  Rng rng(11);
  for (auto [rows, dim] : {std::pair{1, 128}, {64, 128}, {5, 2048}, {3, 77}, {2, 4096}}) {
    const Vec x = rng.normals(size_t(rows) * dim, 3.0f), z = rng.normals(x.size(), 2.0f),
              w = rng.normals(size_t(dim), 0.5f);
    Vec want_g(x.size());
    cpu::rmsnorm_gated(x.data(), z.data(), w.data(), rows, dim, 1e-6f, want_g.data());
    DeviceArray<float> dx = dev(x), dz = dev(z), dw = dev(w), dout(x.size(), DeviceAlloc::Now);
    rmsnorm_gated(dx.data(), dz.data(), dw.data(), rows, dim, 1e-6f, dout.data());
    const std::string what = std::to_string(rows) + "x" + std::to_string(dim);
    double err_g = 0;
    const Vec got_g = host(dout);
    for (size_t i = 0; i < x.size(); ++i)
      err_g = std::max(err_g, std::abs(double(got_g[i]) - want_g[i]) / (std::abs(want_g[i]) + 1e-30));
    record("rmsnorm_gated", what, err_g, kTol);
    EXPECT_LE(err_g, kTol) << what;
    rmsnorm_gated(dx.data(), dz.data(), dw.data(), rows, dim, 1e-6f, dx.data());
    EXPECT_EQ(host(dx), got_g) << what << " in place, as the layer runs it";
  }
}

}  // namespace
}  // namespace ms::cuda::test
