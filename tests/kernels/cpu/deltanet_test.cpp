#include "kernels/cpu/deltanet.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

#include "kernels/deltanet_case.h"
#include "test_support.h"

#include "util/error.h"
#include "util/thread_pool.h"

namespace {

using Vec = std::vector<float>;

using ms::test::Rng;

float max_abs(const Vec& a) {
  float m = 0.0f;
  for (float x : a) m = std::max(m, std::abs(x));
  return m;
}

float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
float max_abs_diff(const Vec& a, const Vec& b) { return max_abs_diff(a.data(), b.data(), a.size()); }

// Runs body once for each SIMD target compiled in and supported by this CPU (the kernels'
// loops are compiled once per target, so each gets tested), then restores normal dispatch.
template <class F>
void for_each_simd_target(F&& body) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
}

using ms::test::DeltaCase;
using ms::test::normalise_rows;
using ms::test::sigmoid;

// The seeded case of the CPU tests.
DeltaCase make_case(int T, int hk, int hv, int dk, int dv, bool random_state, unsigned seed) {
  Rng rng(seed);
  return ms::test::make_delta_case(rng, T, hk, hv, dk, dv, random_state);
}

struct DeltaResult {
  Vec out, state;
};

DeltaResult run_chunked(const DeltaCase& c) {
  DeltaResult r{Vec(size_t(c.T) * c.hv * c.dv), c.state};
  ms::cpu::gated_delta_rule(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.hk, c.hv, c.dk,
                            c.dv, r.state.data(), r.out.data());
  return r;
}

DeltaResult run_reference(const DeltaCase& c) {
  DeltaResult r{Vec(size_t(c.T) * c.hv * c.dv), c.state};
  ms::cpu::gated_delta_rule_reference(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.hk,
                                      c.hv, c.dk, c.dv, r.state.data(), r.out.data());
  return r;
}

// The same recurrence in double precision, written out separately: the float reference's own
// rounding error is measured against it, which is what the chunked kernel's tolerance rests on.
DeltaResult run_double(const DeltaCase& c) {
  const int group = c.hv / c.hk;
  std::vector<double> S(c.state.begin(), c.state.end());
  Vec out(size_t(c.T) * c.hv * c.dv);
  for (int t = 0; t < c.T; ++t)
    for (int h = 0; h < c.hv; ++h) {
      const float* q = &c.q[(size_t(t) * c.hk + h / group) * c.dk];
      const float* k = &c.k[(size_t(t) * c.hk + h / group) * c.dk];
      const float* v = &c.v[(size_t(t) * c.hv + h) * c.dv];
      double* s = &S[size_t(h) * c.dk * c.dv];
      const double decay = std::exp(double(c.g[size_t(t) * c.hv + h])), b = c.beta[size_t(t) * c.hv + h];
      for (int j = 0; j < c.dv; ++j) {
        double kv = 0;
        for (int i = 0; i < c.dk; ++i) kv += k[i] * s[i * c.dv + j] * decay;
        const double delta = (v[j] - kv) * b;
        double o = 0;
        for (int i = 0; i < c.dk; ++i) {
          s[i * c.dv + j] = s[i * c.dv + j] * decay + k[i] * delta;
          o += q[i] * s[i * c.dv + j];
        }
        out[(size_t(t) * c.hv + h) * c.dv + j] = float(o);
      }
    }
  return {out, Vec(S.begin(), S.end())};
}

// Chunked and recurrent forms agree to float32 rounding, relative to the largest magnitude of the
// quantity compared (output or state). Both are contractions (|k| = 1, beta < 1, decay <= 1) of
// O(1) values, each step a sum of at most dk + 64 float32 products, and both measure within
// ~2e-7 of the exact (double) recurrence on these cases; 1e-5 leaves room for longer sequences
// and other SIMD targets while a wrong decay or solve term (errors of 1e-3 and up) cannot pass.
constexpr float kRelTol = 1e-5f;

void expect_close(const DeltaResult& got, const DeltaResult& want, const char* what) {
  const float out_scale = std::max(1.0f, max_abs(want.out)), state_scale = std::max(1.0f, max_abs(want.state));
  EXPECT_LE(max_abs_diff(got.out, want.out), kRelTol * out_scale) << what << ": output";
  EXPECT_LE(max_abs_diff(got.state, want.state), kRelTol * state_scale) << what << ": final state";
}

TEST(GatedDeltaRule, ChunkedMatchesReference) {
  struct Heads {
    int hk, hv;
  };
  struct Dims {
    int dk, dv;
  };
  const Heads heads[] = {{1, 1}, {1, 2}, {2, 4}, {2, 8}};
  const Dims dims[] = {{16, 16}, {32, 64}, {64, 32}, {128, 128}, {128, 16}};
  float worst_chunked = 0, worst_reference = 0;
  unsigned seed = 1;
  for (int T : {1, 2, 63, 64, 65, 130, 200})
    for (const Heads& hd : heads)
      for (const Dims& dd : dims)
        for (bool random_state : {false, true}) {
          if (T > 100 && dd.dk * dd.dv * hd.hv > 128 * 128 * 2) continue;  // keeps the test quick
          SCOPED_TRACE(testing::Message() << "T=" << T << " hk=" << hd.hk << " hv=" << hd.hv << " dk=" << dd.dk
                                          << " dv=" << dd.dv << " state=" << random_state);
          const DeltaCase c = make_case(T, hd.hk, hd.hv, dd.dk, dd.dv, random_state, seed++);
          const DeltaResult ref = run_reference(c), exact = run_double(c);
          expect_close(ref, exact, "reference vs double");
          const float scale = std::max({1.0f, max_abs(exact.out), max_abs(exact.state)});
          for_each_simd_target([&] {
            const DeltaResult chunked = run_chunked(c);
            expect_close(chunked, ref, "chunked vs reference");
            worst_chunked = std::max({worst_chunked, max_abs_diff(chunked.out, exact.out) / scale,
                                      max_abs_diff(chunked.state, exact.state) / scale});
          });
          worst_reference = std::max({worst_reference, max_abs_diff(ref.out, exact.out) / scale,
                                      max_abs_diff(ref.state, exact.state) / scale});
        }
  std::printf("worst relative error against the double recurrence: chunked %.3g, reference %.3g\n",
              worst_chunked, worst_reference);
}

// Worst cases for the chunk's triangular solve: no decay, beta near 1, and keys that repeat or
// nearly repeat, so that A = beta k_r·k_s is close to all ones below the diagonal.
TEST(GatedDeltaRule, ChunkedMatchesReferenceWithRepeatedKeys) {
  for (float spread : {0.0f, 0.01f, 0.3f}) {
    SCOPED_TRACE(testing::Message() << "spread=" << spread);
    DeltaCase c = make_case(150, 1, 2, 32, 32, true, 21);
    Rng rng(22);
    for (size_t i = 0; i < c.k.size(); ++i) c.k[i] = c.k[i % 32] + spread * rng.normal();
    normalise_rows(c.k, 32, 1.0);
    std::fill(c.g.begin(), c.g.end(), 0.0f);
    std::fill(c.beta.begin(), c.beta.end(), 0.999f);
    const DeltaResult ref = run_reference(c);
    for_each_simd_target([&] { expect_close(run_chunked(c), ref, "chunked vs reference"); });
  }
}

// A prompt split across calls (prefill pieces, then token-by-token decode) continues from the
// carried state exactly as one call would.
TEST(GatedDeltaRule, SplitCallsMatchOneCall) {
  const DeltaCase c = make_case(150, 2, 4, 64, 32, true, 77);
  const DeltaResult whole = run_chunked(c);
  for (const std::vector<int>& pieces : std::vector<std::vector<int>>{
           {70, 80}, {64, 86}, {1, 149}, {100, 1, 1, 1, 1, 46}, std::vector<int>(150, 1)}) {
    SCOPED_TRACE(testing::Message() << pieces.size() << " pieces, first " << pieces[0]);
    DeltaResult split{Vec(whole.out.size()), c.state};
    int t0 = 0;
    for (int n : pieces) {
      const size_t qk = size_t(t0) * c.hk * c.dk, vo = size_t(t0) * c.hv * c.dv, gb = size_t(t0) * c.hv;
      ms::cpu::gated_delta_rule(&c.q[qk], &c.k[qk], &c.v[vo], &c.g[gb], &c.beta[gb], n, c.hk, c.hv, c.dk, c.dv,
                                split.state.data(), &split.out[vo]);
      t0 += n;
    }
    expect_close(split, whole, "split vs one call");
  }
}

// Value head h reads key head h / (hv / hk) (HF repeat_interleave): head 3 of 4 sharing 2 key
// heads behaves as a one-head layer given key head 1.
TEST(GatedDeltaRule, ValueHeadsShareKeyHeadsInGroups) {
  const DeltaCase c = make_case(70, 2, 4, 32, 16, true, 5);
  const DeltaResult all = run_chunked(c);
  const int h = 3, kh = 1, T = c.T, dk = c.dk, dv = c.dv;
  DeltaCase one{T, 1, 1, dk, dv, {}, {}, {}, {}, {}, {}};
  for (int t = 0; t < T; ++t) {
    auto take = [&](const Vec& src, Vec& dst, size_t row, int n) {
      dst.insert(dst.end(), src.begin() + row * n, src.begin() + (row + 1) * n);
    };
    take(c.q, one.q, size_t(t) * c.hk + kh, dk);
    take(c.k, one.k, size_t(t) * c.hk + kh, dk);
    take(c.v, one.v, size_t(t) * c.hv + h, dv);
    one.g.push_back(c.g[size_t(t) * c.hv + h]);
    one.beta.push_back(c.beta[size_t(t) * c.hv + h]);
  }
  one.state.assign(c.state.begin() + h * dk * dv, c.state.begin() + (h + 1) * dk * dv);
  const DeltaResult single = run_chunked(one);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < dv; ++j)
      ASSERT_EQ(all.out[(size_t(t) * c.hv + h) * dv + j], single.out[size_t(t) * dv + j]) << "t=" << t;
  EXPECT_EQ(0.0f, max_abs_diff(&all.state[size_t(h) * dk * dv], single.state.data(), size_t(dk) * dv));
}

TEST(GatedDeltaRule, RejectsUngroupedHeads) {
  float x = 0;
  EXPECT_THROW(ms::cpu::gated_delta_rule(&x, &x, &x, &x, &x, 1, 2, 3, 1, 1, &x, &x), ms::Error);
}

// ---- causal conv1d + SiLU ----

struct ConvResult {
  Vec out, state;
};

ConvResult conv_naive(const Vec& x, int T, int C, const Vec& w, int K, Vec state) {
  const int H = K - 1;
  auto xx = [&](int u, int c) { return u < H ? state[size_t(c) * H + u] : x[size_t(u - H) * C + c]; };
  ConvResult r{Vec(size_t(T) * C), Vec(size_t(C) * H)};
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      double s = 0;
      for (int j = 0; j < K; ++j) s += double(w[size_t(c) * K + j]) * xx(t + j, c);
      r.out[size_t(t) * C + c] = float(s / (1 + std::exp(-s)));
    }
  for (int c = 0; c < C; ++c)
    for (int j = 0; j < H; ++j) r.state[size_t(c) * H + j] = xx(T + j, c);
  return r;
}

ConvResult conv_kernel(const Vec& x, int T, int C, const Vec& w, int K, Vec state) {
  ConvResult r{Vec(size_t(T) * C), std::move(state)};
  ms::cpu::causal_conv1d_silu(x.data(), T, C, w.data(), K, r.state.data(), r.out.data());
  return r;
}

TEST(CausalConv1dSilu, MatchesNaive) {
  unsigned seed = 100;
  for (int K : {1, 2, 4})
    for (int C : {1, 5, 37, 1100})
      for (int T : {1, 2, 3, 7, 100})
        for (bool random_state : {false, true}) {
          SCOPED_TRACE(testing::Message() << "K=" << K << " C=" << C << " T=" << T << " state=" << random_state);
          Rng rng(seed++);
          const Vec x = rng.normals(size_t(T) * C), w = rng.normals(size_t(C) * K, 0.5f);
          const Vec state = random_state ? rng.normals(size_t(C) * (K - 1)) : Vec(size_t(C) * (K - 1), 0.0f);
          const ConvResult want = conv_naive(x, T, C, w, K, state);
          for_each_simd_target([&] {
            const ConvResult got = conv_kernel(x, T, C, w, K, state);
            // A sum of K products, then SiLU: a few float32 roundings.
            for (size_t i = 0; i < want.out.size(); ++i)
              ASSERT_NEAR(got.out[i], want.out[i], 2e-6f * std::max(1.0f, std::abs(want.out[i]))) << "i=" << i;
            EXPECT_EQ(got.state, want.state);
          });
        }
}

// SiLU over the whole float range (K = 1, w = 1 makes the conv the identity): large |x| must
// neither overflow nor lose accuracy, and every position of a row is computed alike.
TEST(CausalConv1dSilu, SiluAccurateOverFullRange) {
  Vec x;
  for (float v = -120.0f; v <= 120.0f; v += 0.037f) x.push_back(v);
  for (float v : {-3e38f, -1e4f, -88.8f, -1e-30f, 0.0f, 1e-30f, 88.8f, 1e4f, 3e38f}) x.push_back(v);
  const int C = int(x.size());
  const Vec w(size_t(C), 1.0f);
  for_each_simd_target([&] {
    const ConvResult got = conv_kernel(x, 1, C, w, 1, {});
    for (int c = 0; c < C; ++c) {
      const double want = x[c] / (1.0 + std::exp(-double(x[c])));
      ASSERT_NEAR(got.out[c], want, 4e-7 * std::max(1e-30, std::abs(want)) + 1e-38) << "x=" << x[c];
    }
  });
}

TEST(CausalConv1dSilu, SplitCallsMatchOneCall) {
  const int T = 9, C = 700, K = 4;
  Rng rng(3);
  const Vec x = rng.normals(size_t(T) * C), w = rng.normals(size_t(C) * K, 0.5f), state0 = rng.normals(size_t(C) * 3);
  const ConvResult whole = conv_kernel(x, T, C, w, K, state0);
  for (const std::vector<int>& pieces :
       std::vector<std::vector<int>>{{1, 8}, {2, 7}, {5, 4}, {1, 1, 1, 6}, std::vector<int>(T, 1)}) {
    Vec state = state0, out(size_t(T) * C);
    int t0 = 0;
    for (int n : pieces) {
      ms::cpu::causal_conv1d_silu(&x[size_t(t0) * C], n, C, w.data(), K, state.data(), &out[size_t(t0) * C]);
      t0 += n;
    }
    EXPECT_EQ(out, whole.out) << pieces.size() << " pieces, first " << pieces[0];
    EXPECT_EQ(state, whole.state) << pieces.size() << " pieces, first " << pieces[0];
  }
}

// ---- norms ----

TEST(L2NormHeads, MatchesNaive) {
  const int rows = 37, dim = 128;
  const float eps = 1e-6f;
  Rng rng(11);
  Vec x = rng.normals(size_t(rows) * dim);
  std::fill_n(x.begin(), dim, 0.0f);  // an all-zero row stays zero: eps keeps it finite
  Vec want = x;
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[size_t(r) * dim + i]) * x[size_t(r) * dim + i];
    for (int i = 0; i < dim; ++i) want[size_t(r) * dim + i] = float(x[size_t(r) * dim + i] / std::sqrt(ss + eps));
  }
  ms::cpu::l2norm_heads(x.data(), rows, dim, eps);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], want[i], 1e-6f) << "i=" << i;
}

TEST(RmsNormGated, MatchesNaive) {
  const int rows = 41, dim = 128;
  const float eps = 1e-6f;
  Rng rng(12);
  const Vec x = rng.normals(size_t(rows) * dim, 3.0f), z = rng.normals(size_t(rows) * dim, 2.0f),
            w = rng.normals(dim);
  Vec want(x.size()), got(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[size_t(r) * dim + i]) * x[size_t(r) * dim + i];
    const double inv = 1 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) {
      const size_t e = size_t(r) * dim + i;
      want[e] = float(w[i] * x[e] * inv * (z[e] * sigmoid(z[e])));
    }
  }
  ms::cpu::rmsnorm_gated(x.data(), z.data(), w.data(), rows, dim, eps, got.data());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5f * std::max(1.0f, std::abs(want[i]))) << "i=" << i;
}

// ---- timing (run with --gtest_also_run_disabled_tests) ----

// Seconds per call: wall time, and the process's CPU time (the steadier measure of one thread on
// a shared machine).
struct Timing {
  double wall, cpu;
};

template <class F>
Timing time_calls(F&& f, int reps) {
  f();  // warm up
  const auto w0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  for (int i = 0; i < reps; ++i) f();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() / reps,
          double(std::clock() - c0) / CLOCKS_PER_SEC / reps};
}

TEST(GatedDeltaRule, DISABLED_Timing) {
  struct Shape {
    int hk, hv;
  };
  const int threads = ms::ThreadPool::global().size();
  for (Shape s : {Shape{16, 16}, Shape{16, 32}}) {
    const DeltaCase c = make_case(512, s.hk, s.hv, 128, 128, true, 9);
    DeltaResult r{Vec(size_t(c.T) * c.hv * c.dv), c.state};
    auto chunked = [&] {
      ms::cpu::gated_delta_rule(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.hk, c.hv,
                                c.dk, c.dv, r.state.data(), r.out.data());
    };
    auto stepwise = [&] {
      for (int t = 0; t < c.T; ++t) {
        const size_t qk = size_t(t) * c.hk * c.dk, vo = size_t(t) * c.hv * c.dv, gb = size_t(t) * c.hv;
        ms::cpu::gated_delta_rule(&c.q[qk], &c.k[qk], &c.v[vo], &c.g[gb], &c.beta[gb], 1, c.hk, c.hv, c.dk, c.dv,
                                  r.state.data(), &r.out[vo]);
      }
    };
    auto reference = [&] {
      ms::cpu::gated_delta_rule_reference(c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T,
                                          c.hk, c.hv, c.dk, c.dv, r.state.data(), r.out.data());
    };
    const Timing chunked_n = time_calls(chunked, 10);
    ms::ThreadPool::set_global_threads(1);
    const Timing chunked_1 = time_calls(chunked, 10), step_1 = time_calls(stepwise, 3),
                 ref_1 = time_calls(reference, 2);
    ms::ThreadPool::set_global_threads(threads);
    const double flops = 2.0 * 3 * c.T * c.hv * c.dk * c.dv;  // the three [T, dk] x [dk, dv] products
    std::printf(
        "T=512 hk=%d hv=%d dk=dv=128, one thread (CPU ms): reference %.1f, recurrent T=1 calls %.1f, chunked %.1f "
        "(%.1f GFLOP/s); chunked on %d threads: %.1f ms wall\n",
        s.hk, s.hv, ref_1.cpu * 1e3, step_1.cpu * 1e3, chunked_1.cpu * 1e3, flops / chunked_1.cpu * 1e-9, threads,
        chunked_n.wall * 1e3);
  }
}

}  // namespace
