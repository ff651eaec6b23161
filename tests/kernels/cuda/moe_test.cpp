// cuda::route_topk and cuda::moe_experts against the CPU path on the same inputs.
//
// route_topk: the routed ids must equal cpu::softmax then cpu::top_k's exactly, near-ties
// included; probabilities and weights are computed with the CPU's arithmetic (exp correctly
// rounded, sums in order) and are held to 2 ulps (glibc's expf, the CPU's exp, is not correctly
// rounded in every case). On the H200: ids all equal, weights bit-equal, probabilities within
// 1.2e-7 with at most 7 of 16k values not bit-equal.
//
// moe_experts: the reference runs each (token, slot) row with cpu::matmul on expert_weights()
// of the same records, cpu::silu_mul, and sums w·y over the slots in order. Tolerance: each
// float32 dot may differ from the CPU's by kTol = 1e-6 of the sum of the magnitudes of its terms
// (the bound of matmul_test.cpp, where the H200 shows at most 5e-8), silu by kTol relative, and
// these errors are carried through exactly: for h = silu(g)·u the bound is
// kTol·(1.1·|u|·Σ|g x| + |silu(g)|·Σ|u x| + |h|) (|silu'| ≤ 1.1), for y = down·h it is
// kTol·Σ|d h| + Σ|d|·bound(h), for out Σ_k |w_k|·bound(y_k) + kTol·Σ_k |w_k y_k|. The error
// reported is the largest |gpu − cpu| / bound, which must be ≤ 1; the same bound serves bf16 and
// every affine width, whose magnitudes count |s·q| + |b| per weight as the kernels round them.
// On the H200 the largest err/bound is 5.4e-3 (bf16, 256/64), 1e-4 or less for most cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "quant_support.h"
#include "format/engine_dir.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "model/weights.h"
#include "quant/affine.h"
#include "util/error.h"
#include "util/half.h"

namespace ms::cuda::test {
namespace {

constexpr double kTol = 1e-6;

// ---------------------------------------------------------------------------------------------
// Router

struct RouteCase {
  int T, E, K;
  bool norm;
  enum Kind { Random, NearTies, AllEqual, Underflow } kind;
};

std::string name(const RouteCase& c) {
  static const char* kinds[] = {"random", "near-ties", "all-equal", "underflow"};
  return "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " K=" + std::to_string(c.K) +
         (c.norm ? " norm " : " ") + kinds[c.kind];
}

// Logits of one row: near-ties make the values ranked around the top K equal to or one ulp off
// their neighbour in rank, so that the order depends on the last bit of the probabilities.
Vec route_logits(Rng& rng, const RouteCase& c) {
  Vec x = rng.normals(size_t(c.E), c.kind == RouteCase::Underflow ? 60.0f : 2.0f);
  if (c.kind == RouteCase::AllEqual) std::fill(x.begin(), x.end(), 0.25f);
  if (c.kind == RouteCase::NearTies) {
    std::vector<int> order(static_cast<size_t>(c.E));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return x[size_t(a)] > x[size_t(b)]; });
    for (int r = 1; r < std::min(c.E, 3 * c.K); ++r) {
      const float prev = x[size_t(order[size_t(r - 1)])];
      float& v = x[size_t(order[size_t(r)])];
      switch (rng.gen() % 3) {
        case 0: v = prev; break;
        case 1: v = std::nextafter(prev, -INFINITY); break;
        default: v = std::nextafter(prev, INFINITY); break;
      }
    }
  }
  return x;
}

double rel_diff(float a, float b) { return a == b ? 0.0 : std::abs(double(a) - b) / std::max(std::abs(double(b)), 1e-30); }

TEST(CudaRoute, IdsMatchCpuExactly) {
  MS_REQUIRE_CUDA();
  Rng rng(21);
  const RouteCase cases[] = {{1, 512, 10, true, RouteCase::Random},    {4, 512, 10, true, RouteCase::NearTies},
                             {16, 512, 10, true, RouteCase::NearTies}, {3, 128, 8, true, RouteCase::NearTies},
                             {2, 64, 4, false, RouteCase::NearTies},   {2, 64, 64, true, RouteCase::Random},
                             {2, 512, 10, true, RouteCase::AllEqual},  {3, 512, 10, false, RouteCase::Underflow},
                             {2, 8192, 1, true, RouteCase::NearTies},  {1, 7, 3, true, RouteCase::Random},
                             // past a round a thread:
                             {2, 1024, 600, true, RouteCase::NearTies}, {1, 700, 300, false, RouteCase::Random}};
  for (const RouteCase& c : cases) {
    Vec logits;
    for (int t = 0; t < c.T; ++t) {
      const Vec row = route_logits(rng, c);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    // The CPU path: cpu::softmax, cpu::top_k, and the weights as model/moe.h's route().
    Vec probs = logits;
    cpu::softmax(probs.data(), c.T, c.E);
    std::vector<int> ids(size_t(c.T) * c.K);
    Vec weights(ids.size());
    for (int t = 0; t < c.T; ++t) {
      const float* p = probs.data() + size_t(t) * c.E;
      int* id = ids.data() + size_t(t) * c.K;
      float* w = weights.data() + size_t(t) * c.K;
      cpu::top_k(p, c.E, c.K, id);
      float sum = 0.f;
      for (int k = 0; k < c.K; ++k) sum += (w[k] = p[id[k]]);
      if (c.norm)
        for (int k = 0; k < c.K; ++k) w[k] /= sum;
    }

    // A layer's table of records: distinct made-up addresses, only copied.
    std::vector<uintptr_t> table(size_t(c.E));
    for (size_t e = 0; e < table.size(); ++e) table[e] = 0x10000 + 4096 * e;
    DeviceArray<float> dl = dev(logits), dp(probs.size(), DeviceAlloc::Now), dw(weights.size(), DeviceAlloc::Now);
    DeviceArray<int> di(ids.size(), DeviceAlloc::Now);
    // The table and the records are addresses, kept as the integers the test made them.
    DeviceArray<uintptr_t> dt = DeviceArray<uintptr_t>::from(table, DeviceAlloc::Now), dr(ids.size(), DeviceAlloc::Now);
    route_topk(dl.data(), c.T, c.E, c.K, c.norm, dp.data(), di.data(), dw.data(),
               reinterpret_cast<const uint8_t* const*>(dt.data()), reinterpret_cast<const uint8_t**>(dr.data()));
    const Vec gp = host(dp), gw = host(dw);
    const std::vector<int> gi = di.to_vector();
    const std::vector<uintptr_t> records = dr.to_vector();
    for (size_t i = 0; i < gi.size(); ++i) EXPECT_EQ(records[i], table[size_t(gi[i])]) << name(c) << " record " << i;

    int mismatched = 0;
    for (size_t i = 0; i < ids.size(); ++i) mismatched += gi[i] != ids[i];
    record("route_topk ids", name(c) + " (mismatched)", mismatched, 0);
    EXPECT_EQ(gi, ids) << name(c);
    double perr = 0, werr = 0;
    int pbits = 0;
    for (size_t i = 0; i < probs.size(); ++i) perr = std::max(perr, rel_diff(gp[i], probs[i])), pbits += gp[i] != probs[i];
    for (size_t i = 0; i < weights.size(); ++i) werr = std::max(werr, rel_diff(gw[i], weights[i]));
    record("route_topk probs", name(c) + " (" + std::to_string(pbits) + " not bit-equal)", perr, 2.4e-7);
    record("route_topk weights", name(c), werr, 2.4e-7);
    EXPECT_LE(perr, 2.4e-7) << name(c);
    EXPECT_LE(werr, 2.4e-7) << name(c);
  }
}

TEST(CudaRoute, RejectsWhatItCannotRun) {
  MS_REQUIRE_CUDA();
  const DeviceArray<unsigned char> buf(1 << 20, DeviceAlloc::Now);  // untyped: read as floats and ints
  float* f = reinterpret_cast<float*>(buf.data());
  int* i = reinterpret_cast<int*>(buf.data());
  EXPECT_THROW(route_topk(f, 1, 9000, 8, true, f, i, f), Error);  // too many experts
  EXPECT_THROW(route_topk(f, 1, 8, 9, true, f, i, f), Error);     // k > E
  EXPECT_THROW(route_topk(f, 1, 8, 0, true, f, i, f), Error);     // k = 0
}

// ---------------------------------------------------------------------------------------------
// Routed experts

struct ExpertSet {
  ExpertLayer layout;
  std::vector<uint8_t> blob;  // n_experts records at layout.stride
  const uint8_t* record(int e) const { return blob.data() + size_t(e) * layout.stride; }
};

// E experts with random weights: bits 16 stores bf16, else quantize()'s affine data, its scales
// and biases as scale_type (nudged off the bf16 grid where wider: quant_support.h).
ExpertSet random_experts(Rng& rng, int E, int H, int I, int bits_gate_up, int bits_down, int group,
                         ScaleType scale_type = ScaleType::BF16) {
  auto spec = [&](int bits, int rows, int cols) {
    return ProjSpec{bits, bits == kRawBits ? 0 : group, rows, cols, scale_type};
  };
  ExpertSet s;
  s.layout = plan_expert_layer("model.layers.0.mlp", "experts/layer_000.bin", E,
                               {spec(bits_gate_up, I, H), spec(bits_gate_up, I, H), spec(bits_down, H, I)});
  s.blob.assign(size_t(E) * s.layout.stride, 0);
  for (int e = 0; e < E; ++e)
    for (const ProjLayout& p : s.layout.proj) {
      uint8_t* rec = s.blob.data() + size_t(e) * s.layout.stride;
      Vec w = rng.normals(size_t(p.rows) * p.cols, 0.05f);
      if (p.bits == kRawBits) {
        auto* q = reinterpret_cast<uint16_t*>(rec + p.q_offset);
        for (size_t i = 0; i < w.size(); ++i) q[i] = f32_to_bf16(w[i]);
        continue;
      }
      for (auto& v : w) v += 0.01f;
      const QuantBuffer qb = quantize(w.data(), p.rows, p.cols, p.bits, p.group);
      EXPECT_EQ(qb.q.size(), p.q_bytes);
      std::memcpy(rec + p.q_offset, qb.q.data(), qb.q.size());
      if (scale_type == ScaleType::BF16) {
        std::memcpy(rec + p.scales_offset, qb.scales.data(), p.scales_bytes);
        std::memcpy(rec + p.biases_offset, qb.biases.data(), p.scales_bytes);
      } else {
        const ::ms::test::TypedScales typed = ::ms::test::with_scale_type(qb, scale_type, rng.gen);
        std::memcpy(rec + p.scales_offset, typed.scales.data(), p.scales_bytes);
        std::memcpy(rec + p.biases_offset, typed.biases.data(), p.scales_bytes);
      }
    }
  return s;
}

// |weight| of each column of row r as the kernels' sums see it: |bf16| or |s·q| + |b|.
void abs_row(const Mat& W, int r, Vec& out) {
  out.resize(size_t(W.cols));
  if (W.type == WeightType::BF16) {
    const auto* p = static_cast<const uint16_t*>(W.data) + size_t(r) * W.cols;
    for (int c = 0; c < W.cols; ++c) out[size_t(c)] = std::abs(bf16_to_f32(p[c]));
    return;
  }
  const QuantMat q = W.quant();
  dequantize_row(q, r, out.data());
  for (int c = 0; c < W.cols; ++c) {
    const float b = q.bias(size_t(r) * q.groups_per_row() + size_t(c / q.group));
    out[size_t(c)] = std::abs(out[size_t(c)] - b) + std::abs(b);
  }
}

// m[r] = Σ_c |W[r, c]|·v[c].
Vec abs_matvec(const Mat& W, const Vec& v) {
  Vec m(static_cast<size_t>(W.rows)), a;
  for (int r = 0; r < W.rows; ++r) {
    abs_row(W, r, a);
    double s = 0;
    for (int c = 0; c < W.cols; ++c) s += double(a[size_t(c)]) * v[size_t(c)];
    m[size_t(r)] = float(s);
  }
  return m;
}

Vec abs_of(const float* p, size_t n) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::abs(p[i]);
  return v;
}

struct Reference {
  Vec out, bound;  // [T, H] each
};

// The CPU path on ids [T, K] and weights [T, K], with the error bound of the file comment.
Reference reference(const ExpertSet& s, const Vec& x, int T, int K, const std::vector<int>& ids, const Vec& wt) {
  const int I = s.layout.proj[0].rows, H = s.layout.proj[0].cols;
  Reference ref{Vec(size_t(T) * H, 0.f), Vec(size_t(T) * H, 0.f)};
  const size_t In = size_t(I), Hn = size_t(H);
  Vec g(In), u(In), h(In), y(Hn), bh(In), wy_mag(size_t(T) * Hn, 0.f);
  for (int t = 0; t < T; ++t) {
    const float* xt = x.data() + size_t(t) * H;
    const Vec ax = abs_of(xt, size_t(H));
    for (int k = 0; k < K; ++k) {
      const size_t j = size_t(t) * K + k;
      const MlpWeights m = expert_weights(s.layout, s.record(ids[j]));
      cpu::matmul(xt, 1, m.gate, g.data());
      cpu::matmul(xt, 1, m.up, u.data());
      cpu::silu_mul(g.data(), u.data(), h.data(), I);
      cpu::matmul(h.data(), 1, m.down, y.data());
      const Vec mg = abs_matvec(m.gate, ax), mu = abs_matvec(m.up, ax);
      for (int i = 0; i < I; ++i) {
        const double silu = g[size_t(i)] / (1.0 + std::exp(-double(g[size_t(i)])));
        bh[size_t(i)] = float(kTol * (1.1 * std::abs(u[size_t(i)]) * mg[size_t(i)] + std::abs(silu) * mu[size_t(i)] +
                                      std::abs(h[size_t(i)])));
      }
      const Vec mdh = abs_matvec(m.down, abs_of(h.data(), size_t(I))), mdb = abs_matvec(m.down, bh);
      const float w = wt[j];
      for (int r = 0; r < H; ++r) {
        const size_t o = size_t(t) * H + r;
        ref.out[o] += w * y[size_t(r)];
        ref.bound[o] += std::abs(w) * float(kTol * mdh[size_t(r)] + mdb[size_t(r)]);
        wy_mag[o] += std::abs(w * y[size_t(r)]);
      }
    }
  }
  for (size_t o = 0; o < ref.bound.size(); ++o) ref.bound[o] += float(kTol * wy_mag[o]);
  return ref;
}

RecordMat record_mat(const ProjLayout& p) {
  return {p.bits, p.group, p.rows, p.cols, p.q_offset, p.scales_offset, p.biases_offset, p.scale_type};
}

// The experts on the device and moe_experts on them.
struct DeviceExperts {
  explicit DeviceExperts(const ExpertSet& s)
      : blob(DeviceArray<uint8_t>::from(s.blob, DeviceAlloc::Now)),
        proj{record_mat(s.layout.proj[0]), record_mat(s.layout.proj[1]), record_mat(s.layout.proj[2])},
        stride(s.layout.stride) {}

  // With `shared` (and its gate's logits), the shared expert's gated output added too.
  Vec run(const Vec& x, int T, int K, const std::vector<int>& ids, const Vec& wt, const Vec& shared = {},
          const Vec& shared_logit = {}) const {
    const int H = proj[0].cols;
    std::vector<const uint8_t*> records;
    for (int e : ids) records.push_back(blob.data() + size_t(e) * stride);
    // out starts as NaN: every output must be written.
    const DeviceArray<const uint8_t*> dr = DeviceArray<const uint8_t*>::from(records, DeviceAlloc::Now);
    DeviceArray<float> dx = dev(x), dw = dev(wt), dout = dev(Vec(size_t(T) * H, NAN)),
                       scratch(moe_scratch_floats(T, K, proj), DeviceAlloc::Now), ds = dev(shared), dl = dev(shared_logit);
    moe_experts(dx.data(), T, K, dr.data(), dw.data(), proj, dout.data(),
                scratch.data(), shared.empty() ? nullptr : ds.data(), dl.data());
    return host(dout);
  }

  DeviceArray<uint8_t> blob;
  RecordMat proj[3];
  size_t stride;
};

struct Routed {
  std::vector<int> ids;  // [T, K], distinct within a token, repeated across tokens
  Vec weights;           // [T, K], positive, summing to 1 per token
};

Routed random_routes(Rng& rng, int T, int K, int E, bool same_for_all) {
  Routed r;
  std::vector<int> all(static_cast<size_t>(E));
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < T; ++t) {
    if (!same_for_all || t == 0) std::shuffle(all.begin(), all.end(), rng.gen);
    r.ids.insert(r.ids.end(), all.begin(), all.begin() + K);
    Vec w(static_cast<size_t>(K));
    float sum = 0.f;
    for (auto& v : w) sum += (v = rng.uniform(0.05f, 1.0f));
    for (auto& v : w) r.weights.push_back(v / sum);
  }
  return r;
}

struct MoeCase {
  int H, I, bits_gate_up, bits_down, group, T, K, E;
  bool same_experts;
  ScaleType scales = ScaleType::BF16;
};

std::string name(const MoeCase& c) {
  auto b = [](int bits) { return bits == 16 ? std::string("bf16") : "q" + std::to_string(bits); };
  return std::to_string(c.H) + "/" + std::to_string(c.I) + " " + b(c.bits_gate_up) + "/" + b(c.bits_down) + " g" +
         std::to_string(c.group) + (c.scales == ScaleType::BF16 ? "" : std::string(" ") + scale_type_name(c.scales)) +
         " T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + (c.same_experts ? " same" : "");
}

std::vector<MoeCase> moe_cases() {
  struct Shape {
    int H, I;
  };
  // pycoder-moe (hidden 256, moe_intermediate 64), Qwen3-Next-80B (2048, 512), and one between.
  const Shape shapes[] = {{256, 64}, {2048, 512}, {512, 384}};
  struct Batch {
    int T, K;
  };
  const Batch batches[] = {{1, 1}, {1, 10}, {2, 8}, {4, 10}};
  const int groups[] = {64, 32, 128};
  std::vector<MoeCase> cases;
  int n = 0;
  for (int bits : {16, 2, 3, 4, 8})
    for (const Batch& b : batches) {
      const Shape s = shapes[size_t(n % 3)];
      int group = groups[size_t(n / 3 % 3)];
      while (s.I % group != 0) group /= 2;
      cases.push_back({s.H, s.I, bits, bits, group, b.T, b.K, 16, false});
      ++n;
    }
  // Down at another width than gate and up, and every token on the same experts.
  cases.push_back({2048, 512, 4, 8, 64, 2, 10, 12, false});
  cases.push_back({512, 384, 4, 16, 64, 2, 8, 12, false});
  cases.push_back({256, 64, 16, 4, 32, 3, 8, 12, false});
  cases.push_back({512, 384, 3, 2, 128, 1, 10, 12, false});
  cases.push_back({2048, 512, 4, 4, 64, 4, 10, 10, true});
  cases.push_back({256, 64, 8, 8, 64, 4, 8, 8, true});
  // The layouts of GGUF imports (the float kernels): Q4_0 and Q8_0 (f16 scales, group 32), Q4_K
  // with Q6_K down (f32, groups of 32 and 16), Q5_K; and groups of 16 with bf16 scales.
  cases.push_back({2048, 512, 4, 8, 32, 1, 10, 16, false, ScaleType::F16});
  cases.push_back({512, 384, 8, 8, 32, 4, 10, 12, false, ScaleType::F16});
  cases.push_back({2048, 512, 4, 6, 32, 2, 10, 16, false, ScaleType::F32});
  cases.push_back({256, 64, 5, 6, 16, 3, 8, 12, true, ScaleType::F32});
  cases.push_back({512, 384, 5, 5, 32, 1, 8, 12, false, ScaleType::F32});
  cases.push_back({256, 64, 2, 3, 64, 2, 8, 12, false, ScaleType::F16});
  cases.push_back({512, 384, 4, 4, 16, 2, 8, 12, false});
  return cases;
}

// Every other case adds a shared expert's gated output (out += sigmoid(logit)·s, the CPU's
// shared_gate_add after the routed sum), its bound growing by kTol of |out| and of the term.
TEST(CudaMoe, ExpertsMatchCpu) {
  MS_REQUIRE_CUDA();
  Rng rng(31);
  int n = 0;
  for (const MoeCase& c : moe_cases()) {
    const ExpertSet s = random_experts(rng, c.E, c.H, c.I, c.bits_gate_up, c.bits_down, c.group, c.scales);
    const Routed r = random_routes(rng, c.T, c.K, c.E, c.same_experts);
    const Vec x = rng.normals(size_t(c.T) * c.H);
    Reference ref = reference(s, x, c.T, c.K, r.ids, r.weights);
    Vec shared, logit;
    if (n++ % 2 == 1) {
      shared = rng.normals(size_t(c.T) * c.H), logit = rng.normals(size_t(c.T), 3.0f);
      for (size_t o = 0; o < ref.out.size(); ++o) {
        const float term = 1.0f / (1.0f + std::exp(-logit[o / size_t(c.H)])) * shared[o];
        ref.bound[o] += float(kTol * (std::abs(ref.out[o]) + std::abs(term)));
        ref.out[o] += term;
      }
    }
    const Vec got = DeviceExperts(s).run(x, c.T, c.K, r.ids, r.weights, shared, logit);
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double e = std::abs(double(got[i]) - ref.out[i]) / (ref.bound[i] + 1e-30);
      err = std::max(err, std::isnan(e) ? INFINITY : e);
    }
    record("moe_experts", name(c) + (shared.empty() ? "" : " shared") + " (err/bound)", err, 1.0);
    EXPECT_LE(err, 1.0) << name(c);
  }
}

TEST(CudaMoe, TwoCallsBitIdentical) {
  MS_REQUIRE_CUDA();
  Rng rng(32);
  for (const MoeCase& c : {MoeCase{2048, 512, 4, 4, 64, 4, 10, 16, false}, MoeCase{256, 64, 16, 16, 0, 2, 8, 8, false}}) {
    const ExpertSet s = random_experts(rng, c.E, c.H, c.I, c.bits_gate_up, c.bits_down, c.group);
    const Routed r = random_routes(rng, c.T, c.K, c.E, false);
    const Vec x = rng.normals(size_t(c.T) * c.H);
    const DeviceExperts d(s);
    const Vec a = d.run(x, c.T, c.K, r.ids, r.weights), b = d.run(x, c.T, c.K, r.ids, r.weights);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name(c);
  }
}

// moe_gate_up_routed + moe_down (the routing in the experts' first launch) against route_topk and
// then moe_experts: the same probabilities, ids, weights, records, h and output, bit for bit.
TEST(CudaMoe, RoutingInGateUpIsRouteTopkThenExperts) {
  MS_REQUIRE_CUDA();
  Rng rng(33);
  struct Case {
    int H, I, bits, group, E, K;
    bool norm;
    RouteCase::Kind kind;
  };
  const Case cases[] = {{256, 64, 4, 64, 512, 10, true, RouteCase::Random},
                        {256, 64, 8, 32, 128, 8, false, RouteCase::NearTies},
                        {2048, 512, 4, 64, 40, 10, true, RouteCase::NearTies},
                        {512, 384, 3, 128, 64, 8, true, RouteCase::Random},
                        {256, 64, 2, 64, 8, 8, true, RouteCase::AllEqual}};
  for (const Case& c : cases) {
    const std::string what = std::to_string(c.H) + "/" + std::to_string(c.I) + " q" + std::to_string(c.bits) +
                             " E=" + std::to_string(c.E) + " K=" + std::to_string(c.K);
    const ExpertSet s = random_experts(rng, c.E, c.H, c.I, c.bits, c.bits, c.group);
    const DeviceExperts d(s);
    std::vector<const uint8_t*> table;
    for (int e = 0; e < c.E; ++e) table.push_back(d.blob.data() + size_t(e) * d.stride);
    const Vec logits = route_logits(rng, RouteCase{1, c.E, c.K, c.norm, c.kind});
    const Vec x = rng.normals(size_t(c.H)), shared = rng.normals(size_t(c.H)), shared_logit = rng.normals(1, 3.0f);
    const DeviceArray<const uint8_t*> dt = DeviceArray<const uint8_t*>::from(table, DeviceAlloc::Now);
    DeviceArray<float> dl = dev(logits), dx = dev(x), dsh = dev(shared), dsl = dev(shared_logit);
    struct Run {
      DeviceArray<float> probs;
      DeviceArray<int> ids;
      DeviceArray<float> weights;
      DeviceArray<const uint8_t*> records;
      DeviceArray<float> h, out;
    };
    auto buffers = [&] {
      return Run{DeviceArray<float>(size_t(c.E), DeviceAlloc::Now), DeviceArray<int>(size_t(c.K), DeviceAlloc::Now),
                 DeviceArray<float>(size_t(c.K), DeviceAlloc::Now),
                 DeviceArray<const uint8_t*>(size_t(c.K), DeviceAlloc::Now),
                 DeviceArray<float>(moe_scratch_floats(1, c.K, d.proj), DeviceAlloc::Now), dev(Vec(size_t(c.H), NAN))};
    };
    Run a = buffers(), b = buffers();
    const auto* tab = dt.data();
    route_topk(dl.data(), 1, c.E, c.K, c.norm, a.probs.data(), a.ids.data(), a.weights.data(), tab,
               a.records.data());
    moe_experts(dx.data(), 1, c.K, a.records.data(), a.weights.data(), d.proj,
                a.out.data(), a.h.data(), dsh.data(), dsl.data());
    const InlineRoute r{dl.data(), c.E, c.norm, b.probs.data(), b.ids.data(), b.weights.data(),
                        tab, b.records.data()};
    ASSERT_TRUE(routes_in_gate_up(r, c.K, d.proj)) << what;
    moe_gate_up_routed(dx.data(), c.K, r, d.proj, b.h.data());
    moe_down(b.h.data(), 1, c.K, b.records.data(), b.weights.data(), d.proj, b.out.data(),
             dsh.data(), dsl.data());
    synchronize();
    EXPECT_EQ(bits(a.probs), bits(b.probs)) << what;
    EXPECT_EQ(a.ids.to_vector(), b.ids.to_vector()) << what;
    EXPECT_EQ(bits(a.weights), bits(b.weights)) << what;
    EXPECT_EQ(a.records.to_vector(), b.records.to_vector()) << what;
    EXPECT_EQ(bits(a.h), bits(b.h)) << what;
    EXPECT_EQ(bits(a.out), bits(b.out)) << what;
  }
}

// Where the routing cannot go in the experts' first launch: no table, more than 512 experts,
// K past a warp, bf16 gate and up.
TEST(CudaMoe, RoutingInGateUpRefusesWhatItCannotRun) {
  MS_REQUIRE_CUDA();
  const DeviceArray<unsigned char> buf(1 << 20, DeviceAlloc::Now);  // untyped: read as floats, ints and addresses
  float* f = reinterpret_cast<float*>(buf.data());
  const auto* tab = reinterpret_cast<const uint8_t* const*>(buf.data());
  const RecordMat gate{4, 64, 64, 256, 0, 8192, 9216}, down{4, 64, 256, 64, 0, 8192, 9216};
  const RecordMat q4[3] = {gate, gate, down};
  RecordMat bf16[3] = {gate, gate, down};
  bf16[0].bits = bf16[1].bits = 16;
  const InlineRoute ok{f, 512, true, f, reinterpret_cast<int*>(buf.data()), f, tab,
                       reinterpret_cast<const uint8_t**>(buf.data())};
  EXPECT_TRUE(routes_in_gate_up(ok, 10, q4));
  InlineRoute no_table = ok, many = ok;
  no_table.table = nullptr;
  many.E = 513;
  EXPECT_FALSE(routes_in_gate_up(no_table, 10, q4));
  EXPECT_FALSE(routes_in_gate_up(many, 10, q4));
  EXPECT_FALSE(routes_in_gate_up(ok, 33, q4));
  EXPECT_FALSE(routes_in_gate_up(ok, 10, bf16));
  EXPECT_THROW(moe_gate_up_routed(f, 10, many, q4, f), Error);
  InlineRoute no_probs = ok;
  no_probs.probs = nullptr;
  EXPECT_THROW(moe_gate_up_routed(f, 10, no_probs, q4, f), Error);
}

TEST(CudaMoe, RejectsWhatItCannotRun) {
  MS_REQUIRE_CUDA();
  const DeviceArray<unsigned char> buf(1 << 20, DeviceAlloc::Now);  // untyped: read as floats and addresses
  const float* x = reinterpret_cast<const float*>(buf.data());
  float* y = reinterpret_cast<float*>(buf.data());
  const auto* rec = reinterpret_cast<const uint8_t**>(buf.data());
  const RecordMat gate{4, 64, 64, 256, 0, 8192, 9216}, down{4, 64, 256, 64, 0, 8192, 9216};
  RecordMat p[3] = {gate, gate, down};
  p[1].bits = 8;  // gate and up at different widths
  EXPECT_THROW(moe_experts(x, 1, 2, rec, x, p, y, y), Error);
  RecordMat q[3] = {gate, gate, gate};  // down not [H, I]
  EXPECT_THROW(moe_experts(x, 1, 2, rec, x, q, y, y), Error);
  RecordMat r[3] = {gate, gate, down};
  r[0].group = 48, r[1].group = 48;
  EXPECT_THROW(moe_experts(x, 1, 2, rec, x, r, y, y), Error);
  RecordMat a[3] = {gate, gate, down};
  EXPECT_THROW(moe_experts(x + 1, 1, 2, rec, x, a, y, y), Error);  // misaligned x
  RecordMat w[3] = {gate, gate, down};
  w[0].cols = w[1].cols = w[2].rows = 1 << 20;  // x too wide to stage in shared memory (refused before any launch)
  EXPECT_THROW(moe_experts(x, 1, 2, rec, x, w, y, y), Error);
}

}  // namespace
}  // namespace ms::cuda::test
