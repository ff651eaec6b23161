// The model's glue kernels (kernels/cpu/model_ops.h) against naive double-precision references.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/model_ops.h"
#include "random.h"

namespace ms::cpu {
namespace {

double sigmoid_ref(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// x [rows, dim] -> x / rms(x) * (offset + w), in double.
std::vector<double> rmsnorm_ref(const std::vector<double>& x, int dim, const float* w, float offset, float eps) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / size_t(dim); ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += x[r * size_t(dim) + size_t(i)] * x[r * size_t(dim) + size_t(i)];
    const double scale = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) out[r * size_t(dim) + size_t(i)] = x[r * size_t(dim) + size_t(i)] * scale * (offset + w[i]);
  }
  return out;
}

// Rotate-half RoPE on the first rot dims of each head, token t at position pos0 + t.
void rope_ref(std::vector<double>& x, int T, int heads, int hd, int rot, int pos0, double theta) {
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h) {
      double* v = x.data() + (size_t(t) * size_t(heads) + size_t(h)) * size_t(hd);
      for (int i = 0; i < rot / 2; ++i) {
        const double a = (pos0 + t) * std::pow(theta, -2.0 * i / rot);
        const double x0 = v[i], x1 = v[i + rot / 2];
        v[i] = x0 * std::cos(a) - x1 * std::sin(a);
        v[i + rot / 2] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
}

void expect_close(const float* got, const std::vector<double>& want, double tol, const char* what) {
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " " << i;
}

TEST(AttentionPrepare, MatchesNaiveSplitNormsAndRope) {
  for (bool gated : {false, true}) {
    const int T = 3, nh = 4, nkv = 2, hd = 16, rot = 8, pos0 = 5;
    const float offset = gated ? 1.f : 0.f, eps = 1e-6f;
    const size_t qw = size_t(nh) * hd, kvw = size_t(nkv) * hd;
    const auto q_raw = randn(size_t(T) * qw * (gated ? 2 : 1), 1), k = randn(size_t(T) * kvw, 2), v = randn(size_t(T) * kvw, 3);
    const auto q_norm = randn(size_t(hd), 4, 0.1f), k_norm = randn(size_t(hd), 5, 0.1f);
    std::vector<float> q(size_t(T) * qw), gate(gated ? q.size() : 0), k_out(k.size()), v_out(v.size());
    attention_prepare({.q_raw = q_raw.data(), .k = k.data(), .v = v.data(), .q_norm = q_norm.data(), .k_norm = k_norm.data(),
                       .q = q.data(), .gate = gate.data(), .k_out = k_out.data(), .v_out = v_out.data(), .theta = 10000.0,
                       .offset = offset, .eps = eps, .T = T, .nh = nh, .nkv = nkv, .hd = hd, .rot_dim = rot,
                       .pos0 = pos0, .gated = gated});
    // Gated: per head hd query values, then hd gate values.
    std::vector<double> qd(q.size()), gd(gate.size()), kd(k.begin(), k.end());
    for (size_t r = 0; r < size_t(T) * nh; ++r)
      for (int i = 0; i < hd; ++i) {
        const size_t src = gated ? r * 2 * hd + size_t(i) : r * hd + size_t(i);
        qd[r * hd + size_t(i)] = q_raw[src];
        if (gated) gd[r * hd + size_t(i)] = q_raw[src + size_t(hd)];
      }
    qd = rmsnorm_ref(qd, hd, q_norm.data(), offset, eps);
    kd = rmsnorm_ref(kd, hd, k_norm.data(), offset, eps);
    rope_ref(qd, T, nh, hd, rot, pos0, 10000.0);
    rope_ref(kd, T, nkv, hd, rot, pos0, 10000.0);
    expect_close(q.data(), qd, 1e-5, "q");
    expect_close(k_out.data(), kd, 1e-5, "k");
    if (gated) expect_close(gate.data(), gd, 0, "gate");
    EXPECT_EQ(v_out, v);
  }
}

TEST(SigmoidGate, ScalesBySigmoid) {
  auto out = randn(50, 6);
  const auto gate = randn(50, 7, 3.f);
  std::vector<double> want(out.size());
  for (size_t i = 0; i < out.size(); ++i) want[i] = out[i] * sigmoid_ref(gate[i]);
  sigmoid_gate(out.data(), gate.data(), out.size());
  expect_close(out.data(), want, 1e-6, "out");
}

// With a conv kernel of width 1 the conv is silu(w * x) per channel, with no state to carry.
TEST(DeltaNetPrepare, MatchesNaiveSplitConvNormsAndGates) {
  const int T = 2, nk = 2, nv = 4, dk = 8, dv = 4, r = nv / nk;
  const size_t key_dim = size_t(nk) * dk, value_dim = size_t(nv) * dv, conv_dim = 2 * key_dim + value_dim;
  const size_t group = size_t(2 * dk + 2 * r * dv);
  const auto qkvz = randn(size_t(T) * nk * group, 8), ba = randn(size_t(T) * 2 * nv, 9);
  const auto conv_w = randn(conv_dim, 10), A_log = randn(size_t(nv), 11, 0.5f), dt_bias = randn(size_t(nv), 12, 0.5f);
  std::vector<float> A(A_log.size());
  for (size_t h = 0; h < A.size(); ++h) A[h] = -std::exp(A_log[h]);
  const float eps = 1e-6f, q_scale = 0.35f;
  std::vector<float> q(size_t(T) * key_dim), k(q.size()), v(size_t(T) * value_dim), z(v.size()), g(size_t(T) * nv),
      beta(g.size());
  deltanet_prepare({.qkvz = qkvz.data(), .ba = ba.data(), .conv_w = conv_w.data(), .A = A.data(),
                    .dt_bias = dt_bias.data(), .conv_state = nullptr, .q = q.data(), .k = k.data(), .v = v.data(),
                    .z = z.data(), .g = g.data(), .beta = beta.data(), .T = T, .nk = nk, .nv = nv, .dk = dk, .dv = dv,
                    .conv_k = 1, .eps = eps, .q_scale = q_scale});
  auto silu = [](double x) { return x * sigmoid_ref(x); };
  std::vector<double> qd(q.size()), kd(k.size()), vd(v.size()), zd(z.size()), gd(g.size()), bd(beta.size());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nk; ++h) {
      const float* src = qkvz.data() + (size_t(t) * nk + size_t(h)) * group;
      for (int i = 0; i < dk; ++i) {
        const size_t qc = size_t(h) * dk + size_t(i), kc = key_dim + qc;
        qd[size_t(t) * key_dim + qc] = silu(double(src[i]) * conv_w[qc]);
        kd[size_t(t) * key_dim + qc] = silu(double(src[dk + i]) * conv_w[kc]);
      }
      for (int i = 0; i < r * dv; ++i) {
        const size_t vc = size_t(h) * size_t(r * dv) + size_t(i);
        vd[size_t(t) * value_dim + vc] = silu(double(src[2 * dk + i]) * conv_w[2 * key_dim + vc]);
        zd[size_t(t) * value_dim + vc] = src[2 * dk + r * dv + i];
      }
      for (int i = 0; i < r; ++i) {
        const size_t head = size_t(h) * r + size_t(i), at = size_t(t) * nv + head;
        const double b = ba[size_t(t) * 2 * nv + size_t(h) * 2 * r + size_t(i)];
        const double a = ba[size_t(t) * 2 * nv + size_t(h) * 2 * r + size_t(r + i)];
        const double sp = a + dt_bias[head] > 20 ? a + dt_bias[head] : std::log1p(std::exp(a + dt_bias[head]));
        bd[at] = sigmoid_ref(b);
        gd[at] = double(A[head]) * sp;
      }
    }
  // q and k L2-normalised per head (eps inside the root), q then scaled.
  for (auto* x : {&qd, &kd})
    for (size_t hrow = 0; hrow < x->size() / size_t(dk); ++hrow) {
      double ss = 0;
      for (int i = 0; i < dk; ++i) ss += (*x)[hrow * dk + size_t(i)] * (*x)[hrow * dk + size_t(i)];
      for (int i = 0; i < dk; ++i) (*x)[hrow * dk + size_t(i)] /= std::sqrt(ss + eps);
    }
  for (auto& e : qd) e *= q_scale;
  expect_close(q.data(), qd, 1e-5, "q");
  expect_close(k.data(), kd, 1e-5, "k");
  expect_close(v.data(), vd, 1e-5, "v");
  expect_close(z.data(), zd, 0, "z");
  expect_close(g.data(), gd, 1e-5, "g");
  expect_close(beta.data(), bd, 1e-6, "beta");
}

TEST(ExpertUsers, GatherScatterAndSumSlots) {
  const int T = 4, K = 2, H = 3, E = 3;
  const auto x = randn(size_t(T) * H, 13), wts = randn(size_t(T) * K, 14);
  const std::vector<std::vector<int>> users = {{0, 3, 5}, {1, 6}, {2, 4, 7}};  // token * K + slot
  const ExpertUsers g{users, wts, K};
  std::vector<float> partial(size_t(T) * K * H, -1.f);
  for (int e = 0; e < E; ++e) {
    const auto& u = users[size_t(e)];
    std::vector<float> xb(u.size() * H);
    gather_users(g, e, x.data(), H, xb.data());
    for (size_t j = 0; j < u.size(); ++j)
      for (int h = 0; h < H; ++h) ASSERT_EQ(xb[j * H + size_t(h)], x[size_t(u[j] / K) * H + size_t(h)]) << e << " " << j;
    const auto yb = randn(u.size() * H, 20 + uint32_t(e));
    scatter_users(g, e, yb.data(), H, partial.data());
    for (size_t j = 0; j < u.size(); ++j)
      for (int h = 0; h < H; ++h)
        ASSERT_EQ(partial[size_t(u[j]) * H + size_t(h)], wts[size_t(u[j])] * yb[j * H + size_t(h)]) << e << " " << j;
  }
  std::vector<float> out(size_t(T) * H);
  sum_slots(partial.data(), T, K, H, out.data());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float want = 0.f;  // in slot order, in float: the order is part of the contract
      for (int k = 0; k < K; ++k) want += partial[(size_t(t) * K + size_t(k)) * H + size_t(h)];
      EXPECT_EQ(out[size_t(t) * H + size_t(h)], want);
    }
}

TEST(SharedGateAdd, AddsTheSigmoidGatedSharedExpert) {
  const int T = 3, H = 20;
  const auto x = randn(size_t(T) * H, 15), s = randn(size_t(T) * H, 16), w = randn(size_t(H), 17, 0.3f);
  auto out = randn(size_t(T) * H, 18);
  std::vector<double> want(out.begin(), out.end());
  for (int t = 0; t < T; ++t) {
    double dot = 0;
    for (int h = 0; h < H; ++h) dot += double(x[size_t(t) * H + size_t(h)]) * w[size_t(h)];
    for (int h = 0; h < H; ++h) want[size_t(t) * H + size_t(h)] += sigmoid_ref(dot) * s[size_t(t) * H + size_t(h)];
  }
  shared_gate_add(out.data(), s.data(), x.data(), Mat{WeightType::F32, w.data(), 1, H}, T, H);
  expect_close(out.data(), want, 1e-5, "out");
}

}  // namespace
}  // namespace ms::cpu
