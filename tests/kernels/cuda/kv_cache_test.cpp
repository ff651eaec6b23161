// The CUDA KV cache kernels (kernels/cuda/kv_cache.cu) and attention over packed caches against
// the CPU's (quant/kv_quant.h, kernels/cpu/model_ops.h's kv_store, cpu::attention).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "quant/kv_quant.h"

namespace ms::cuda::test {
namespace {

using Bytes = std::vector<uint8_t>;

DeviceArray<uint8_t> dev_bytes(const Bytes& b) { return DeviceArray<uint8_t>::from(b, DeviceAlloc::Now); }
Bytes host_bytes(const DeviceArray<uint8_t>& b) {
  synchronize();
  return b.to_vector();
}

struct Rot {
  explicit Rot(KvRotation kind, int hd) : cpu(kind, hd) {
    if (!cpu.blocks().empty()) blocks = DeviceArray<float>::from(cpu.blocks(), DeviceAlloc::Now);
    if (!cpu.signs().empty()) signs = DeviceArray<float>::from(cpu.signs(), DeviceAlloc::Now);
  }
  KvRotationView view() const { return {cpu.kind(), blocks.data(), signs.data()}; }
  KvRotator cpu;
  DeviceArray<float> blocks, signs;
};

const char* name(KvRotation r) { return kv_rotation_name(r); }

// Unrotated rows encode to the CPU's bytes exactly (the same IEEE division, rounding and half
// conversions). Rotated, the rotation's sums may round differently by an ulp, which can move a
// value across a code boundary: each decoded value then stays within one step of the CPU's.
TEST(CudaKvCache, StoreEncodesAsTheCpu) {
  MS_REQUIRE_CUDA();
  Rng rng(11);
  const int T = 5, n_kv = 2, pos0 = 3;
  for (const int hd : {64, 256})
    for (const int bits : {32, 16, 8, 4, 3, 2})
      for (const KvRotation rot : {KvRotation::None, KvRotation::So4, KvRotation::Hadamard}) {
        const KvSide side{bits, 64};
        const Rot r(rot, hd);
        const Vec rows = rng.normals(size_t(T) * n_kv * hd, 2.0f);
        const size_t row_bytes = side.row_bytes(hd), stride = size_t(n_kv) * row_bytes;
        Bytes want((pos0 + T) * stride, 0xab);
        cpu::kv_store(rows.data(), size_t(T) * n_kv, hd, side, rot == KvRotation::None ? nullptr : &r.cpu,
                      want.data() + pos0 * stride);
        DeviceArray<float> drows = dev(rows);
        DeviceArray<uint8_t> got = dev_bytes(Bytes(want.size(), 0xab));
        kv_store(drows.data(), T, n_kv, hd, side, r.view(), got.data(), pos0);
        const Bytes g = host_bytes(got);
        const std::string what = "hd " + std::to_string(hd) + " bits " + std::to_string(bits) + " " + name(rot);
        for (size_t i = 0; i < pos0 * stride; ++i) ASSERT_EQ(g[i], 0xab) << what << ": a row before pos0 changed";
        if (rot == KvRotation::None || bits == 32) {
          if (rot == KvRotation::None) {
            EXPECT_EQ(g, want) << what;
          }
          continue;
        }
        for (size_t r0 = 0; r0 < size_t(T) * n_kv; ++r0) {
          Vec a(static_cast<size_t>(hd)), b(static_cast<size_t>(hd));
          kv_decode(side, want.data() + pos0 * stride + r0 * row_bytes, hd, a.data());
          kv_decode(side, g.data() + pos0 * stride + r0 * row_bytes, hd, b.data());
          const float range = *std::max_element(a.begin(), a.end()) - *std::min_element(a.begin(), a.end());
          for (int i = 0; i < hd; ++i) {  // bf16: one ulp, 2^-7 of the value at most
            const float step = bits == 16 ? std::abs(a[size_t(i)]) / 128 : range / float((1 << bits) - 1);
            ASSERT_LE(std::abs(a[size_t(i)] - b[size_t(i)]), 1.01f * step + 1e-5f) << what;
          }
        }
      }
}

// The rotation and its undoing (and the gate after it) as KvRotator's: 1e-6 of max(1, |x|).
TEST(CudaKvCache, RotateAsTheCpu) {
  MS_REQUIRE_CUDA();
  Rng rng(12);
  for (const KvRotation rot : {KvRotation::So4, KvRotation::Hadamard})
    for (const int hd : {64, 128, 256})
      for (const bool inverse : {false, true}) {
        const Rot r(rot, hd);
        const size_t rows = 7;
        const Vec x = rng.normals(rows * hd), gate = rng.normals(rows * hd, 2.0f);
        Vec want = x;
        inverse ? r.cpu.undo(want.data(), rows) : r.cpu.apply(want.data(), rows);
        DeviceArray<float> d = dev(x);
        kv_rotate(d.data(), rows, hd, r.view(), inverse);
        const std::string what = std::string(name(rot)) + " hd " + std::to_string(hd) + (inverse ? " undo" : " apply");
        const Vec got = host(d);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6 * std::max(1.f, std::abs(want[i]))) << what;
        DeviceArray<float> dg = dev(x), dgate = dev(gate);
        kv_rotate(dg.data(), rows, hd, r.view(), inverse, dgate.data());
        const Vec gated = host(dg);
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_NEAR(gated[i], want[i] / (1.f + std::exp(-gate[i])), 1e-6 * std::max(1.f, std::abs(want[i]))) << what;
      }
}

// Attention over packed caches (the same bytes on both sides) against cpu::attention: the
// float32 kernels' tolerance, 1e-5 of max|v|, decode and prefill, with the position on the device.
TEST(CudaKvCache, AttentionOverPackedCachesMatchesTheCpu) {
  MS_REQUIRE_CUDA();
  constexpr double kTol = 1e-5;
  struct Case {
    int T, pos0, n_heads, n_kv, hd;
  };
  Rng rng(13);
  const std::pair<int, int> formats[] = {{16, 16}, {8, 8}, {4, 3}, {4, 4}, {32, 4}, {3, 2}};
  for (const Case& c : {Case{1, 1000, 16, 2, 256}, Case{7, 30, 8, 2, 128}, Case{1, 4096, 4, 2, 64}, Case{33, 0, 4, 1, 64}})
    for (const auto& [kb, vb] : formats) {
      const KvSide ks{kb, 64}, vs{vb, 64};
      const int len = c.pos0 + c.T;
      const Vec q = rng.normals(size_t(c.T) * c.n_heads * c.hd), k = rng.normals(size_t(len) * c.n_kv * c.hd, 2.0f),
                v = rng.normals(size_t(len) * c.n_kv * c.hd);
      Bytes kp(size_t(len) * c.n_kv * ks.row_bytes(c.hd)), vp(size_t(len) * c.n_kv * vs.row_bytes(c.hd));
      cpu::kv_store(k.data(), size_t(len) * c.n_kv, c.hd, ks, nullptr, kp.data());
      cpu::kv_store(v.data(), size_t(len) * c.n_kv, c.hd, vs, nullptr, vp.data());
      Vec want(q.size());
      cpu::attention(q.data(), cpu::KvRows{kp.data(), ks}, cpu::KvRows{vp.data(), vs}, c.T, c.pos0, c.n_heads, c.n_kv,
                     c.hd, want.data());
      DeviceArray<float> dq = dev(q), dout(q.size(), DeviceAlloc::Now);
      DeviceArray<uint8_t> dk = dev_bytes(kp), dv = dev_bytes(vp);
      const int positions = len + 100;
      DeviceArray<float> scratch(attention_scratch_floats(c.T, c.n_heads, c.hd, positions), DeviceAlloc::Now);
      const KvRowsView krows{dk.data(), kv_side_view(ks, c.hd)}, vrows{dv.data(), kv_side_view(vs, c.hd)};
      attention(dq.data(), krows, vrows, c.T, c.pos0, c.n_heads, c.n_kv, c.hd, dout.data(), scratch.data(), positions);
      const std::string what = "T=" + std::to_string(c.T) + " pos0=" + std::to_string(c.pos0) + " hd=" +
                               std::to_string(c.hd) + " K" + std::to_string(kb) + "/V" + std::to_string(vb);
      const double err = max_abs_diff(host(dout), want) / max_abs(v);
      record("attention packed", what, err, kTol);
      EXPECT_LE(err, kTol) << what;
      const DeviceArray<int> dpos = DeviceArray<int>::from(std::vector<int>{c.pos0}, DeviceAlloc::Now);
      DeviceArray<float> dout_at(q.size(), DeviceAlloc::Now);
      attention(dq.data(), krows, vrows, c.T, -1, c.n_heads, c.n_kv, c.hd, dout_at.data(), scratch.data(), positions,
                dpos.data());
      EXPECT_EQ(host(dout_at), host(dout)) << what << ", position on the device";
    }
}

}  // namespace
}  // namespace ms::cuda::test
