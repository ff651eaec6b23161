// The row-wise and elementwise CUDA kernels and attention against the CPU kernels (kernels/cpu/ops.h).
// Tolerances are per kernel (float32 throughout): the GPU reduces in a tree where the CPU sums in
// order, and CUDA's expf/sincosf are within 2 ulp where glibc's are within 1.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "quant_support.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "quant/affine.h"
#include "util/half.h"

namespace ms::cuda::test {
namespace {

// Max over elements of |a - b| / (|b| + floor).
double rel_diff(const Vec& a, const Vec& b, double floor) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]) / (std::abs(b[i]) + floor));
  return m;
}

TEST(CudaOps, RmsNormBothOffsets) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-5;  // relative per element: only 1/rms differs, by a few ulp
  Rng rng(3);
  for (float offset : {0.0f, 1.0f})
    for (auto [rows, dim] : {std::pair{1, 64}, {7, 2048}, {33, 5120}, {3, 100}}) {
      const Vec x = rng.normals(size_t(rows) * dim), w = rng.normals(size_t(dim), 0.3f);
      Vec want(x.size());
      cpu::rmsnorm(x.data(), rows, dim, w.data(), offset, 1e-6f, want.data());
      DeviceArray<float> dx = dev(x), dw = dev(w), dout(x.size(), DeviceAlloc::Now);
      rmsnorm(dx.data(), rows, dim, dw.data(), offset, 1e-6f, dout.data());
      const double err = rel_diff(host(dout), want, 1e-30);
      const std::string what = "offset " + std::to_string(int(offset)) + " " + std::to_string(rows) + "x" +
                               std::to_string(dim);
      record("rmsnorm", what, err, kTol);
      EXPECT_LE(err, kTol) << what;
    }
}

// add_rmsnorm: x += y, the same additions as the CPU's (exact), then rmsnorm of the sum.
TEST(CudaOps, AddRmsNorm) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-5;  // as RmsNormBothOffsets
  Rng rng(31);
  for (float offset : {0.0f, 1.0f})
    for (auto [rows, dim] : {std::pair{1, 2048}, {5, 100}, {9, 5120}}) {
      Vec x = rng.normals(size_t(rows) * dim), want(x.size());
      const Vec y = rng.normals(x.size()), w = rng.normals(size_t(dim), 0.3f);
      DeviceArray<float> dx = dev(x), dy = dev(y), dw = dev(w), dout(x.size(), DeviceAlloc::Now);
      for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
      cpu::rmsnorm(x.data(), rows, dim, w.data(), offset, 1e-6f, want.data());
      add_rmsnorm(dx.data(), dy.data(), rows, dim, dw.data(), offset, 1e-6f, dout.data());
      const std::string what = "offset " + std::to_string(int(offset)) + " " + std::to_string(rows) + "x" +
                               std::to_string(dim);
      EXPECT_EQ(host(dx), x) << what;
      const double err = rel_diff(host(dout), want, 1e-30);
      record("add_rmsnorm", what, err, kTol);
      EXPECT_LE(err, kTol) << what;
    }
}

TEST(CudaOps, AttentionGqaDecodeAndPrefill) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-5;  // absolute, relative to max|v|: the output is a convex mix of v rows
  struct Case {
    int T, pos0, n_heads, n_kv, hd;
  };
  Rng rng(5);
  // Decode rows split their positions among blocks, some splits empty where positions are few.
  for (const Case& c : {Case{1, 0, 4, 4, 64}, Case{1, 1000, 16, 2, 256}, Case{7, 30, 8, 2, 128},
                        Case{64, 0, 4, 1, 32}, Case{3, 4097, 2, 1, 256}, Case{1, 8191, 32, 4, 128},
                        Case{2, 5, 16, 2, 256}, Case{1, 40, 1, 1, 32}}) {
    const int len = c.pos0 + c.T;
    const Vec q = rng.normals(size_t(c.T) * c.n_heads * c.hd), k = rng.normals(size_t(len) * c.n_kv * c.hd, 2.0f),
              v = rng.normals(size_t(len) * c.n_kv * c.hd);
    Vec want(q.size());
    cpu::attention(q.data(), k.data(), v.data(), c.T, c.pos0, c.n_heads, c.n_kv, c.hd, want.data());
    DeviceArray<float> dq = dev(q), dk = dev(k), dv = dev(v), dout(q.size(), DeviceAlloc::Now);
    // Positions bound by the cache's rows, as a captured step's: more chunk blocks than the rows use.
    const int positions = len + 100;
    DeviceArray<float> scratch(attention_scratch_floats(c.T, c.n_heads, c.hd, positions), DeviceAlloc::Now);
    attention(dq.data(), dk.data(), dv.data(), c.T, c.pos0, c.n_heads, c.n_kv, c.hd,
              dout.data(), scratch.data(), positions);
    const double err = max_abs_diff(host(dout), want) / max_abs(v);
    const std::string what = "T=" + std::to_string(c.T) + " pos0=" + std::to_string(c.pos0) + " heads " +
                             std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) + " hd=" +
                             std::to_string(c.hd);
    record("attention", what, err, kTol);
    EXPECT_LE(err, kTol) << what;
    const DeviceArray<int> dpos = DeviceArray<int>::from(std::vector<int>{c.pos0}, DeviceAlloc::Now);
    DeviceArray<float> dout_at(q.size(), DeviceAlloc::Now);
    attention(dq.data(), dk.data(), dv.data(), c.T, -1, c.n_heads, c.n_kv, c.hd, dout_at.data(),
              scratch.data(), positions, dpos.data());
    EXPECT_EQ(host(dout_at), host(dout)) << what << ", position on the device";
    // Gated (Qwen3-Next): the same output times sigmoid(gate), applied as it is stored.
    const Vec gate = rng.normals(q.size(), 3.0f);
    Vec want_gated = want;
    for (size_t i = 0; i < gate.size(); ++i) want_gated[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
    DeviceArray<float> dgate = dev(gate), dout_gated(q.size(), DeviceAlloc::Now);
    attention(dq.data(), dk.data(), dv.data(), c.T, c.pos0, c.n_heads, c.n_kv, c.hd,
              dout_gated.data(), scratch.data(), positions, nullptr, dgate.data());
    const double err_gated = max_abs_diff(host(dout_gated), want_gated) / max_abs(v);
    record("attention", what + " gated", err_gated, kTol);
    EXPECT_LE(err_gated, kTol) << what << ", gated";
  }
}

// A prompt's rows (a block each, its chunks in turn) and the same tokens one at a time (a block
// per chunk, then their fold) give the same bits: a token's output does not depend on T.
TEST(CudaOps, AttentionTokensAreTheSameBitsWhateverT) {
  MS_REQUIRE_CUDA();
  const int T = 12, pos0 = 100, nh = 16, nkv = 2, hd = 256, len = pos0 + T;
  Rng rng(8);
  const Vec q = rng.normals(size_t(T) * nh * hd), k = rng.normals(size_t(len) * nkv * hd, 2.0f),
            v = rng.normals(size_t(len) * nkv * hd);
  DeviceArray<float> dq = dev(q), dk = dev(k), dv = dev(v), dall(q.size(), DeviceAlloc::Now);
  ASSERT_EQ(attention_scratch_floats(T, nh, hd, len), 0u) << "192 rows: a block each";
  attention(dq.data(), dk.data(), dv.data(), T, pos0, nh, nkv, hd, dall.data(), nullptr, len);
  const Vec all = host(dall);
  const size_t row = size_t(nh) * hd;
  for (int t = 0; t < T; ++t) {
    const int positions = pos0 + t + 1;
    ASSERT_GT(attention_scratch_floats(1, nh, hd, positions), 0u) << "16 rows: a block per chunk";
    DeviceArray<float> scratch(attention_scratch_floats(1, nh, hd, positions), DeviceAlloc::Now), done(row, DeviceAlloc::Now);
    attention(dq.data() + t * row, dk.data(), dv.data(), 1, pos0 + t, nh, nkv, hd, done.data(),
              scratch.data(), positions);
    EXPECT_EQ(host(done), Vec(all.begin() + long(t * row), all.begin() + long((t + 1) * row))) << "token " << t;
  }
}

TEST(CudaOps, AttentionRefusesWhatItCannotRun) {
  MS_REQUIRE_CUDA();
  ASSERT_GT(attention_scratch_floats(1, 4, 64, 100), 0u);  // a decode token's few rows: a block per chunk
  DeviceArray<float> buf(size_t(1) << 18, DeviceAlloc::Now);  // 1 MiB
  float* p = buf.data();
  EXPECT_THROW(attention(p, p, p, 1, 99, 4, 4, 64, p, nullptr, 100), Error);  // no scratch
  EXPECT_THROW(attention(p, p, p, 1, 99, 4, 4, 64, p, p, 50), Error);         // positions short of pos0 + T
}

// embed_row: the row a device int names, bf16 widened or affine codes dequantized, the bits the
// host's embed_tokens makes (dequantize_row), at every width the engine stores.
TEST(CudaOps, EmbedRowIsTheHostsRow) {
  MS_REQUIRE_CUDA();
  Rng rng(53);
  constexpr int kRows = 7, kCols = 384;
  const Vec w = rng.normals(size_t(kRows) * kCols);
  auto check = [&](const Mat& table, const std::string& what, auto&& host_row) {
    for (int row : {0, 3, kRows - 1}) {
      const DeviceArray<int> id = DeviceArray<int>::from(std::vector<int>{row}, DeviceAlloc::Now);
      DeviceArray<float> out(size_t(kCols), DeviceAlloc::Now);
      embed_row(table, id.data(), out.data());
      Vec want(kCols);
      host_row(row, want.data());
      EXPECT_EQ(host(out), want) << what << " row " << row;
    }
  };
  std::vector<uint16_t> b16(w.size());
  for (size_t i = 0; i < w.size(); ++i) b16[i] = f32_to_bf16(w[i]);
  DeviceArray<uint16_t> db = DeviceArray<uint16_t>::from(b16, DeviceAlloc::Now);
  check(Mat{WeightType::BF16, db.data(), kRows, kCols}, "bf16", [&](int r, float* o) {
    for (int c = 0; c < kCols; ++c) o[c] = bf16_to_f32(b16[size_t(r) * kCols + size_t(c)]);
  });
  // Every width and group the format allows, with bf16 scales and with the f16 and f32 ones of
  // imports.
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {16, 32, 128})
      for (ScaleType st : {ScaleType::BF16, ScaleType::F16, ScaleType::F32}) {
        if (group == 16 && bits < 4) continue;
        const QuantBuffer qb = quantize(w.data(), kRows, kCols, bits, group);
        const ::ms::test::TypedScales typed = ::ms::test::with_scale_type(qb, st, rng.gen);
        DeviceArray<uint8_t> dq = DeviceArray<uint8_t>::from(qb.q, DeviceAlloc::Now);
        DeviceArray<uint16_t> ds = DeviceArray<uint16_t>::from(typed.scales, DeviceAlloc::Now);
        DeviceArray<uint16_t> dbias = DeviceArray<uint16_t>::from(typed.biases, DeviceAlloc::Now);
        Mat table{WeightType::Affine, dq.data(), kRows, kCols, bits, group, ds.data(), dbias.data(), st};
        check(table, std::to_string(bits) + "-bit g" + std::to_string(group) + " " + scale_type_name(st),
              [&](int r, float* o) { dequantize_row(typed.view, r, o); });
      }
  EXPECT_THROW(embed_row(Mat{WeightType::F32, db.data(), kRows, kCols}, reinterpret_cast<const int*>(db.data()), nullptr),
               Error);
}

TEST(CudaOps, SiluMul) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-6;  // relative per element (floor 1e-30): one expf and a division
  Rng rng(6);
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(1) << 20}) {
    Vec gate = rng.normals(size_t(n), 4.0f), up = rng.normals(size_t(n));
    if (n > 2) gate[0] = -120.0f, gate[1] = 95.0f;  // exp(-x) overflowing and underflowing
    Vec want(gate.size());
    cpu::silu_mul(gate.data(), up.data(), want.data(), n);
    DeviceArray<float> dg = dev(gate), du = dev(up), dout(gate.size(), DeviceAlloc::Now);
    silu_mul(dg.data(), du.data(), dout.data(), n);
    const double err = rel_diff(host(dout), want, 1e-30);
    record("silu_mul", "n=" + std::to_string(n), err, kTol);
    EXPECT_LE(err, kTol) << n;
  }
}

// out[t] += sigmoid(logit[t]) · s[t] (a quantized shared-expert gate's add) against a naive
// double-precision reference.
TEST(CudaOps, SharedLogitAdd) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-6;  // of |out| + |s| per element: an expf within 2 ulp, a division, an FMA
  Rng rng(8);
  for (auto [T, H] : {std::pair{1, 128}, {5, 2048}}) {
    const Vec out0 = rng.normals(size_t(T) * H), s = rng.normals(size_t(T) * H), logit = rng.normals(size_t(T), 3.0f);
    Vec want(out0.size());
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const size_t i = size_t(t) * H + h;
        want[i] = float(double(out0[i]) + double(s[i]) / (1.0 + std::exp(-double(logit[size_t(t)]))));
      }
    DeviceArray<float> dout = dev(out0), ds = dev(s), dl = dev(logit);
    shared_logit_add(dout.data(), ds.data(), dl.data(), T, H);
    const Vec got = host(dout);
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i)
      err = std::max(err, std::abs(double(got[i]) - want[i]) / (std::abs(out0[i]) + std::abs(s[i])));
    record("shared_logit_add", std::to_string(T) + "x" + std::to_string(H), err, kTol);
    EXPECT_LE(err, kTol) << T << "x" << H;
  }
}

TEST(CudaOps, Softmax) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-5;  // relative per element: exp and a float sum of up to 4096 terms (the CPU sums in order)
  Rng rng(7);
  for (auto [rows, n] : {std::pair{1, 8}, {16, 512}, {3, 4096}, {5, 1}}) {
    const Vec x = rng.normals(size_t(rows) * n, 3.0f);
    Vec want = x;
    cpu::softmax(want.data(), rows, n);
    DeviceArray<float> dx = dev(x);
    softmax(dx.data(), rows, n);
    const double err = rel_diff(host(dx), want, 1e-30);
    const std::string what = std::to_string(rows) + "x" + std::to_string(n);
    record("softmax", what, err, kTol);
    EXPECT_LE(err, kTol) << what;
  }
}

TEST(CudaOps, TopKExactWithTies) {
  MS_REQUIRE_CUDA();
  Rng rng(8);
  struct Case {
    int rows, n, k;
    bool ties;
  };
  for (const Case& c : {Case{1, 8, 2, false}, Case{32, 512, 10, false}, Case{4, 64, 64, true},
                        Case{16, 128, 8, true}, Case{2, 3000, 1, true}, Case{2, 700, 600, true}}) {
    Vec x = rng.normals(size_t(c.rows) * c.n);
    if (c.ties)
      for (auto& v : x) v = std::floor(v * 2.0f) / 2.0f;
    std::vector<int> want(size_t(c.rows) * c.k);
    for (int r = 0; r < c.rows; ++r) cpu::top_k(x.data() + size_t(r) * c.n, c.n, c.k, want.data() + size_t(r) * c.k);
    DeviceArray<float> dx = dev(x);
    DeviceArray<int> didx(want.size(), DeviceAlloc::Now);
    top_k(dx.data(), c.rows, c.n, c.k, didx.data());
    synchronize();
    const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                             (c.ties ? " ties" : "");
    const std::vector<int> got = didx.to_vector();
    int mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
    record("top_k", what + " (mismatched indices)", mismatches, 0);
    EXPECT_EQ(got, want) << what;
  }
}

}  // namespace
}  // namespace ms::cuda::test
