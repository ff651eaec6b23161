// cpu::attention against a naive double-precision reference, over float32 and packed KV caches
// (quant/kv_quant.h), and the bits it promises to keep: a token's output is the same whatever T
// is and however many threads share the work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "random.h"
#include "util/thread_pool.h"

namespace ms::cpu {
namespace {

struct Case {
  int T, pos0, nh, nkv, hd;
  std::string name() const {
    return "T=" + std::to_string(T) + " pos0=" + std::to_string(pos0) + " heads " + std::to_string(nh) + "/" +
           std::to_string(nkv) + " hd=" + std::to_string(hd);
  }
};

struct Inputs {
  std::vector<float> q, k, v;
};

Inputs inputs(const Case& c, uint32_t seed) {
  const size_t cache = size_t(c.pos0 + c.T) * size_t(c.nkv) * size_t(c.hd);
  return {randn(size_t(c.T) * c.nh * c.hd, seed), randn(cache, seed + 1, 2.f), randn(cache, seed + 2)};
}

std::vector<float> run(const Case& c, const Inputs& in) {
  std::vector<float> out(in.q.size());
  attention(in.q.data(), in.k.data(), in.v.data(), c.T, c.pos0, c.nh, c.nkv, c.hd, out.data());
  return out;
}

// The naive reference: out [T, nh, hd] in double, the scores, softmax and weighted sum in turn.
std::vector<double> reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v) {
  std::vector<double> out(q.size());
  for (int t = 0; t < c.T; ++t)
    for (int h = 0; h < c.nh; ++h) {
      const int kvh = h / (c.nh / c.nkv), len = c.pos0 + t + 1;
      std::vector<double> p(static_cast<size_t>(len));
      double mx = -1e300, sum = 0;
      for (int s = 0; s < len; ++s) {
        double d = 0;
        for (int i = 0; i < c.hd; ++i)
          d += double(q[(size_t(t) * c.nh + h) * c.hd + i]) * k[(size_t(s) * c.nkv + kvh) * c.hd + i];
        p[size_t(s)] = d / std::sqrt(double(c.hd));
        mx = std::max(mx, p[size_t(s)]);
      }
      for (auto& e : p) sum += (e = std::exp(e - mx));
      for (int i = 0; i < c.hd; ++i) {
        double o = 0;
        for (int s = 0; s < len; ++s) o += p[size_t(s)] / sum * v[(size_t(s) * c.nkv + kvh) * c.hd + i];
        out[(size_t(t) * c.nh + h) * c.hd + i] = o;
      }
    }
  return out;
}

// Positions past 128 take several chunks; 16/2 is Qwen3-Next-80B's grouping of query heads.
TEST(Attention, CausalGqaMatchesReference) {
  for (const Case& c : {Case{1, 0, 2, 1, 8}, Case{1, 9, 4, 2, 16}, Case{6, 0, 4, 2, 16}, Case{5, 3, 8, 2, 32},
                        Case{1, 300, 16, 2, 64}, Case{3, 255, 8, 2, 40}, Case{2, 1000, 4, 1, 16},
                        Case{1, 127, 2, 2, 32}}) {
    const Inputs in = inputs(c, 8);
    const std::vector<float> out = run(c, in);
    const std::vector<double> want = reference(c, in.q, in.k, in.v);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-5) << c.name() << " at " << i;
  }
}

// The rows of x [positions · n_kv, hd] encoded in `side` (kv_encode), and what they decode to.
struct Packed {
  std::vector<uint8_t> rows;
  std::vector<float> decoded;
};
Packed pack(const std::vector<float>& x, int hd, KvSide side) {
  const size_t n = x.size() / size_t(hd), row = side.row_bytes(hd);
  Packed p{std::vector<uint8_t>(n * row), std::vector<float>(x.size())};
  for (size_t r = 0; r < n; ++r) {
    kv_encode(side, x.data() + r * size_t(hd), hd, p.rows.data() + r * row);
    kv_decode(side, p.rows.data() + r * row, hd, p.decoded.data() + r * size_t(hd));
  }
  return p;
}

// Attention over packed caches (bf16, quantized, and one side float32) against the reference over
// the values kv_decode gives: the same tolerance as float32's, since the kernel decodes the same
// values (its scale·q + bias fused, a rounding apart) and attends over them as over floats.
TEST(Attention, PackedCachesMatchTheReferenceOverTheirDecodedValues) {
  const std::pair<int, int> formats[] = {{16, 16}, {8, 8}, {4, 3}, {4, 4}, {3, 2}, {32, 4}, {4, 32}, {2, 8}};
  for (const Case& c : {Case{1, 300, 16, 2, 64}, Case{7, 120, 4, 2, 128}, Case{1, 0, 2, 1, 32}, Case{3, 255, 8, 2, 256}})
    for (const auto& [kb, vb] : formats)
      for (const int group : {32, 64}) {
        if (c.hd % group) continue;
        const KvSide ks{kb, group}, vs{vb, group};
        const Inputs in = inputs(c, 8);
        const Packed k = pack(in.k, c.hd, ks), v = pack(in.v, c.hd, vs);
        std::vector<float> out(in.q.size());
        attention(in.q.data(), KvRows{k.rows.data(), ks}, KvRows{v.rows.data(), vs}, c.T, c.pos0, c.nh, c.nkv, c.hd,
                  out.data());
        const std::vector<double> want = reference(c, in.q, k.decoded, v.decoded);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], want[i], 1e-5) << c.name() << " K" << kb << "/V" << vb << " g" << group << " at " << i;
      }
}

// Over a packed cache too, a token's output is the same bits whatever T is.
TEST(Attention, PackedTokensAreTheSameBitsWhateverT) {
  const Case c{20, 140, 8, 2, 64};
  const KvSide ks{4, 64}, vs{3, 32};
  const Inputs in = inputs(c, 5);
  const Packed k = pack(in.k, c.hd, ks), v = pack(in.v, c.hd, vs);
  auto run_packed = [&](const Case& cc, const float* q) {
    std::vector<float> out(size_t(cc.T) * cc.nh * cc.hd);
    attention(q, KvRows{k.rows.data(), ks}, KvRows{v.rows.data(), vs}, cc.T, cc.pos0, cc.nh, cc.nkv, cc.hd, out.data());
    return out;
  };
  const std::vector<float> all = run_packed(c, in.q.data());
  const size_t row = size_t(c.nh) * size_t(c.hd);
  for (int t = 0; t < c.T; ++t) {
    const std::vector<float> single = run_packed(Case{1, c.pos0 + t, c.nh, c.nkv, c.hd}, in.q.data() + size_t(t) * row);
    ASSERT_EQ(single, std::vector<float>(all.begin() + long(t * row), all.begin() + long((t + 1) * row))) << "token " << t;
  }
}

// A prompt of T tokens and the same tokens one at a time (a decode step's few jobs split their
// chunks among threads, a prompt's many jobs fold theirs in turn) give the same bits.
TEST(Attention, TokensAreTheSameBitsWhateverT) {
  for (const Case& c : {Case{40, 200, 16, 2, 64}, Case{9, 0, 4, 1, 32}}) {
    const Inputs in = inputs(c, 21);
    const std::vector<float> all = run(c, in);
    const size_t row = size_t(c.nh) * size_t(c.hd);
    for (int t = 0; t < c.T; ++t) {
      const Case one{1, c.pos0 + t, c.nh, c.nkv, c.hd};
      const auto q_t = in.q.begin() + long(t * row);
      const Inputs in1{std::vector<float>(q_t, q_t + long(row)), in.k, in.v};
      const std::vector<float> single = run(one, in1);
      ASSERT_EQ(single, std::vector<float>(all.begin() + long(t * row), all.begin() + long((t + 1) * row)))
          << c.name() << ", token " << t;
    }
  }
}

TEST(Attention, TheSameBitsOnOneThreadAsOnAll) {
  const int threads = ThreadPool::global().size();
  for (const Case& c : {Case{1, 700, 16, 2, 64}, Case{12, 150, 8, 2, 32}}) {
    const Inputs in = inputs(c, 33);
    const std::vector<float> shared = run(c, in);
    ThreadPool::set_global_threads(1);
    const std::vector<float> alone = run(c, in);
    ThreadPool::set_global_threads(threads);
    EXPECT_EQ(alone, shared) << c.name();
  }
}

}  // namespace
}  // namespace ms::cpu
