// The CUDA backend's glue (backends/cuda/cuda_backend.h) against the CPU backend's loops on random
// inputs: the gated attention, the attention and Gated DeltaNet inputs and the expert
// gather/scatter/sum.
// Built with the CUDA backend; skipped where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <utility>

#include "kernels/cuda/device.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "util/half.h"

namespace ms {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -3.f, float hi = 3.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

// A float vector's bytes (a float32 KV cache's rows) and back.
std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
std::vector<float> floats_of(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

class CudaBackendGlue : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device";
    device_weights = std::make_unique<DeviceWeights>(ModelWeights{});
    device_state = std::make_unique<DeviceState>(cfg, 0);
  }
  CudaBackend gpu() { return {*device_weights, *device_state}; }
  cuda::DeviceArray<float> up(const std::vector<float>& v) { return cuda::DeviceArray<float>::from(v.data(), v.size()); }
  cuda::DeviceArray<uint8_t> up(const std::vector<uint8_t>& v) { return cuda::DeviceArray<uint8_t>::from(v.data(), v.size()); }

  ModelConfig cfg;
  State host_state{cfg};
  CpuBackend cpu{host_state};
  std::unique_ptr<DeviceWeights> device_weights;
  std::unique_ptr<DeviceState> device_state;
};

// The backends' attention with and without a gate (Qwen3-Next's sigmoid-gated output). Tolerance
// 1e-5 of max|v|, tests/kernels/cuda/ops_test.cpp's for the kernel: the output is a convex mix of
// v rows, times a sigmoid.
TEST_F(CudaBackendGlue, AttentionGatedAndNot) {
  const int T = 3, pos0 = 5, nh = 4, nkv = 2, hd = 64, len = pos0 + T;
  const size_t nq = size_t(T) * nh * hd, nkvs = size_t(len) * nkv * hd;
  const auto q = random_vec(nq, 1), k = random_vec(nkvs, 2), v = random_vec(nkvs, 3), gate = random_vec(nq, 4);
  auto dq = up(q), dgate = up(gate);
  KVCache host_kv;
  host_kv.n_kv = nkv, host_kv.head_dim = hd, host_kv.k = bytes_of(k), host_kv.v = bytes_of(v);
  DeviceKV device_kv;
  device_kv.n_kv = nkv, device_kv.head_dim = hd, device_kv.k = up(host_kv.k), device_kv.v = up(host_kv.v);
  const float tol = 1e-5f * 3.0f;  // max|v| <= 3
  for (const bool gated : {false, true}) {
    std::vector<float> want(nq);
    cpu.attention(q.data(), host_kv, T, pos0, nh, nkv, hd, gated ? gate.data() : nullptr, want.data());
    cuda::DeviceArray<float> d(nq);
    gpu().attention(dq.data(), device_kv, T, pos0, nh, nkv, hd, gated ? dgate.data() : nullptr, d.data());
    const std::vector<float> got = d.to_vector();
    for (size_t i = 0; i < nq; ++i) ASSERT_NEAR(got[i], want[i], tol) << (gated ? "gated " : "") << i;
  }
}

// The largest |got - want| / max(1, |want|).
double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    err = std::max(err, std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(double(want[i]))));
  return err;
}

// cuda::attention_prepare (one launch) against the CPU's split, norms, RoPE and store in turn,
// with the position passed and read on the GPU (a captured step's step_pos). Tolerance: 2e-6 of
// max(1, |want|): the norms' sums of squares in another order, cos and sin of the same float
// angle. The gate and v are copies, and cache rows other than the tokens' stay as they were:
// exact.
TEST_F(CudaBackendGlue, AttentionPrepareMatchesTheCpuSteps) {
  struct Case {
    int T, nh, nkv, hd, rot, pos0;
    double theta;
    bool gated;
    float offset;
  };
  const Case cases[] = {
      {1, 16, 2, 256, 64, 1000, 1e7, true, 1.f},  // Qwen3-Next's decode: partial rotation
      {5, 4, 4, 128, 128, 0, 1e6, false, 0.f},    // Qwen3-MoE's: full rotation
      {17, 2, 1, 64, 32, 70000, 1e4, true, 0.f},  // far positions
      {3, 4, 2, 300, 300, 5, 1e6, false, 1.f},    // heads longer than a block's threads
  };
  for (const Case& c : cases) {
    const size_t q_width = size_t(c.nh) * c.hd, width = size_t(c.nkv) * c.hd;
    const int capacity = c.pos0 + c.T + 2;
    const auto q_raw = random_vec(size_t(c.T) * q_width * (c.gated ? 2 : 1), 30);
    const auto k = random_vec(size_t(c.T) * width, 31), v = random_vec(size_t(c.T) * width, 32);
    const auto q_norm = random_vec(size_t(c.hd), 33, -1.f, 1.f), k_norm = random_vec(size_t(c.hd), 34, -1.f, 1.f);
    KVCache want{c.nkv, c.hd};
    want.reserve(capacity);
    const std::vector<uint8_t> untouched = bytes_of(std::vector<float>(want.k.size() / sizeof(float), 7.f));
    want.k = want.v = untouched;
    std::vector<float> q(size_t(c.T) * q_width), gate(c.gated ? q.size() : 0);
    cpu.attention_prepare(q_raw.data(), k.data(), v.data(), c.T, c.nh, c.nkv, c.hd, c.gated, q_norm.data(),
                          k_norm.data(), c.offset, 1e-6f, c.rot, c.pos0, c.theta, q.data(), gate.data(), want);
    const std::string what = "T " + std::to_string(c.T) + " hd " + std::to_string(c.hd) + " rot " +
                             std::to_string(c.rot) + " pos0 " + std::to_string(c.pos0);
    const std::vector<int> pos{c.pos0};
    const cuda::DeviceArray<int> dpos = cuda::DeviceArray<int>::from(pos.data(), 1);
    auto dq_raw = up(q_raw), dk = up(k), dv = up(v), dqn = up(q_norm), dkn = up(k_norm);
    for (const int* step_pos : {static_cast<const int*>(nullptr), static_cast<const int*>(dpos.data())}) {
      DeviceKV got{c.nkv, c.hd};
      got.k = up(untouched), got.v = up(untouched);
      cuda::DeviceArray<float> dq(q.size()), dgate(gate.size());
      CudaBackend be = gpu();
      be.step_pos = step_pos;
      be.attention_prepare(dq_raw.data(), dk.data(), dv.data(), c.T, c.nh, c.nkv, c.hd, c.gated, dqn.data(), dkn.data(),
                           c.offset, 1e-6f, c.rot, step_pos ? -1 : c.pos0, c.theta, dq.data(), dgate.data(), got);
      const std::string at = what + (step_pos ? ", position on the device" : ", position passed");
      EXPECT_LE(rel_err(dq.to_vector(), q), 2e-6) << at << ": q";
      EXPECT_LE(rel_err(floats_of(got.k.to_vector()), floats_of(want.k)), 2e-6) << at << ": k cache";
      EXPECT_EQ(dgate.to_vector(), gate) << at;
      EXPECT_EQ(got.v.to_vector(), want.v) << at;
      const std::vector<float> gk = floats_of(got.k.to_vector());
      for (size_t i = 0; i < gk.size(); ++i)
        if (i / width < size_t(c.pos0) || i / width >= size_t(c.pos0 + c.T)) {
          ASSERT_EQ(gk[i], 7.f) << at << ": " << i;
        }
    }
  }
}

// cuda::deltanet_prepare (one launch) against the CPU's split, conv, norms and gates in turn, over
// two calls that carry the conv state. Tolerance: 2e-6 of max(1, |want|), the conv's (K products
// summed in the same order, silu's and the gates' expf); q and k, normalised, sit well inside it.
// z and the state are copies: exact.
TEST_F(CudaBackendGlue, DeltaNetPrepareMatchesTheCpuSteps) {
  struct Case {
    int T1, T2, nk, nv, dk, dv, K;
  };
  const Case cases[] = {
      {1, 1, 16, 32, 128, 128, 4},  // Qwen3-Next-80B's decode
      {5, 1, 2, 6, 32, 16, 4},      // a small shape
      {33, 40, 1, 2, 300, 40, 4},   // several blocks of tokens; heads longer than a block's threads
      {1, 2, 2, 4, 32, 48, 6},      // fewer tokens than the state holds
      {2, 9, 2, 2, 16, 8, 1},       // no state
      {20, 3, 2, 4, 32, 200, 18},   // a state longer than a block's tokens; value heads over several blocks
  };
  for (const Case& c : cases) {
    const int r = c.nv / c.nk;
    const size_t key_dim = size_t(c.nk) * c.dk, value_dim = size_t(c.nv) * c.dv, conv_dim = 2 * key_dim + value_dim;
    const size_t group = size_t(2 * c.dk + 2 * r * c.dv);
    const auto conv_w = random_vec(conv_dim * c.K, 20, -1.f, 1.f), A_log = random_vec(size_t(c.nv), 21, -1.f, 1.f);
    std::vector<float> A(A_log.size());
    for (size_t h = 0; h < A.size(); ++h) A[h] = -std::exp(A_log[h]);
    const auto dt_bias = random_vec(size_t(c.nv), 22, -1.f, 1.f);
    std::vector<float> st = random_vec(conv_dim * (c.K - 1), 23);
    auto dw = up(conv_w), dA = up(A), ddt = up(dt_bias), dst = up(st);
    const float q_scale = 1.0f / std::sqrt(float(c.dk));
    const std::string what = "T " + std::to_string(c.T1) + "+" + std::to_string(c.T2) + " nk " + std::to_string(c.nk) +
                             " dk " + std::to_string(c.dk) + " K " + std::to_string(c.K);
    for (const int T : {c.T1, c.T2}) {
      const auto qkvz = random_vec(size_t(T) * c.nk * group, 24 + uint32_t(T));
      const auto ba = random_vec(size_t(T) * 2 * c.nv, 25 + uint32_t(T), -30.f, 30.f);  // both sides of softplus's threshold
      std::vector<float> q(size_t(T) * key_dim), k(q.size()), v(size_t(T) * value_dim), z(v.size());
      std::vector<float> g(size_t(T) * c.nv), beta(g.size());
      cpu.deltanet_prepare(qkvz.data(), ba.data(), T, c.nk, c.nv, c.dk, c.dv, conv_w.data(), c.K, st.data(),
                           A.data(), dt_bias.data(), 1e-6f, q_scale, q.data(), k.data(), v.data(), z.data(),
                           g.data(), beta.data());
      auto dqkvz = up(qkvz), dba = up(ba);
      cuda::DeviceArray<float> dq(q.size()), dk(k.size()), dv(v.size()), dz(z.size()), dg(g.size()), dbeta(beta.size());
      gpu().deltanet_prepare(dqkvz.data(), dba.data(), T, c.nk, c.nv, c.dk, c.dv, dw.data(), c.K, dst.data(),
                             dA.data(), ddt.data(), 1e-6f, q_scale, dq.data(), dk.data(), dv.data(), dz.data(),
                             dg.data(), dbeta.data());
      const std::pair<const cuda::DeviceArray<float>*, const std::vector<float>*> outs[] = {
          {&dq, &q}, {&dk, &k}, {&dv, &v}, {&dg, &g}, {&dbeta, &beta}};
      const char* names[] = {"q", "k", "v", "g", "beta"};
      for (size_t o = 0; o < std::size(outs); ++o)
        EXPECT_LE(rel_err(outs[o].first->to_vector(), *outs[o].second), 2e-6)
            << what << ": " << names[o] << " after " << T << " tokens";
      EXPECT_EQ(dz.to_vector(), z) << what;
      EXPECT_EQ(dst.to_vector(), st) << what << ": state after " << T << " tokens";
    }
  }
}

TEST_F(CudaBackendGlue, ExpertGatherScatterSumAndSharedGate) {
  const int T = 6, K = 3, H = 96, E = 5;
  const auto x = random_vec(size_t(T) * H, 8), weights = random_vec(size_t(T) * K, 9, 0.f, 1.f);
  std::vector<std::vector<int>> users(E);
  for (int i = 0; i < T * K; ++i) users[size_t((i * 7 + i / K) % E)].push_back(i);
  std::vector<float> partial(size_t(T) * K * H), xb(size_t(T) * H);
  auto dx = up(x);
  cuda::DeviceArray<float> dpartial(partial.size()), dxb(xb.size());
  const auto cg = cpu.expert_groups(users, weights, K);
  const auto gg = gpu().expert_groups(users, weights, K);
  for (int e = 0; e < E; ++e) {
    if (users[size_t(e)].empty()) continue;
    const auto y = random_vec(users[size_t(e)].size() * H, 10 + uint32_t(e));
    auto dy = up(y);
    cpu.gather_users(cg, e, x.data(), H, xb.data());
    gpu().gather_users(gg, e, dx.data(), H, dxb.data());
    const auto got = dxb.to_vector();
    for (size_t i = 0; i < users[size_t(e)].size() * H; ++i) ASSERT_EQ(got[i], xb[i]) << e << " " << i;
    cpu.scatter_users(cg, e, y.data(), H, partial.data());
    gpu().scatter_users(gg, e, dy.data(), H, dpartial.data());
  }
  EXPECT_EQ(dpartial.to_vector(), partial);
  std::vector<float> out(size_t(T) * H);
  cuda::DeviceArray<float> dout(out.size());
  cpu.sum_slots(partial.data(), T, K, H, out.data());
  gpu().sum_slots(dpartial.data(), T, K, H, dout.data());
  EXPECT_EQ(dout.to_vector(), out);

  // The shared expert's gate: a bf16 row's dot with x, summed in another order than the CPU's.
  const auto s = random_vec(out.size(), 20), gate = random_vec(size_t(H), 21, -0.3f, 0.3f);
  std::vector<uint16_t> gate_bf16(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) gate_bf16[i] = f32_to_bf16(gate[i]);
  cuda::DeviceArray<uint16_t> dgate = cuda::DeviceArray<uint16_t>::from(gate_bf16.data(), gate_bf16.size());
  auto ds = up(s);
  cpu.shared_gate_add(out.data(), s.data(), x.data(), Mat{WeightType::BF16, gate_bf16.data(), 1, H}, T, H);
  gpu().shared_gate_add(dout.data(), ds.data(), dx.data(), Mat{WeightType::BF16, dgate.data(), 1, H}, T, H);
  const auto got = dout.to_vector();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], out[i], 1e-5f * (1.f + std::abs(out[i]))) << i;
}

}  // namespace
}  // namespace ms
