// cuda::int_matmul against cpu::int_matmul bit for bit (kernels/int_dot.h: the same bits on both
// devices), over the layouts it takes, partial row and token tiles, small values beside large
// ones, NaN and infinity; cuda::int_experts and int_expert_records against cpu::int_expert (the
// hybrid decode's CPU expert), bit for bit; and matmul's choice of it where int_matmul_pays.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/int_expert.h"
#include "kernels/cpu/int_matmul.h"
#include "kernels/cuda/int_gemm.h"
#include "kernels/cuda/ops.h"
#include "quant/affine.h"
#include "quant_support.h"
#include "util/error.h"

namespace ms::cuda::test {
namespace {

// A quantized matrix on the host and its copy on the device.
struct DeviceQuant {
  QuantBuffer qb;
  ::ms::test::TypedScales typed;
  QuantMat host;
  DeviceArray<uint8_t> q;
  DeviceArray<uint16_t> scales, biases;
  Mat device;
};

DeviceQuant device_quant(Rng& rng, int rows, int cols, int bits, int group, ScaleType st) {
  DeviceQuant d;
  Vec wf = rng.normals(size_t(rows) * cols, 0.05f);
  for (auto& v : wf) v += 0.01f;
  d.qb = quantize(wf.data(), rows, cols, bits, group);
  d.typed = ::ms::test::with_scale_type(d.qb, st, rng.gen);
  d.host = st == ScaleType::BF16 ? d.qb.view() : d.typed.view;
  const size_t words = size_t(rows) * d.host.groups_per_row();
  d.q = DeviceArray<uint8_t>::from(d.qb.q, DeviceAlloc::Now);
  d.scales = DeviceArray<uint16_t>::from(std::vector<uint16_t>(d.host.scales, d.host.scales + words), DeviceAlloc::Now);
  d.biases = DeviceArray<uint16_t>::from(std::vector<uint16_t>(d.host.biases, d.host.biases + words), DeviceAlloc::Now);
  QuantMat qm = d.host;
  qm.q = d.q.data(), qm.scales = d.scales.data(), qm.biases = d.biases.data();
  d.device = Mat::affine(qm);
  return d;
}

std::vector<uint32_t> float_bits(const Vec& v) {
  std::vector<uint32_t> u(v.size());
  if (!v.empty()) std::memcpy(u.data(), v.data(), v.size() * sizeof(float));
  return u;
}

// x of normal values, every eighth scaled by 2^-24 (small values beside large ones in a unit).
Vec inputs(Rng& rng, size_t n) {
  Vec x = rng.normals(n);
  for (size_t i = 3; i < n; i += 8) x[i] = std::ldexp(x[i], -24);
  return x;
}

bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// The first output whose bits differ. Any NaN equals any NaN: int_dot.h defines where a NaN
// lands, not its payload (the GPU's arithmetic writes the canonical 0x7fffffff, x86 keeps the
// operand's 0x7fc00000).
size_t first_mismatch(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i] && !(is_nan_bits(a[i]) && is_nan_bits(b[i]))) return i;
  return a.size();
}

TEST(CudaIntGemm, MatchesCpuBitForBit) {
  MS_REQUIRE_CUDA();
  struct Shape {
    int rows, cols, T;
  };
  // Partial row tiles (rows not a multiple of 64), partial token tiles (T not a multiple of 32),
  // one token, a prompt chunk, wide rows.
  const Shape shapes[] = {{5, 128, 1}, {70, 256, 17}, {129, 1024, 33}, {512, 2048, 100}, {64, 4096, 7}, {300, 512, 512}};
  Rng rng(11);
  int checked = 0;
  for (int nbits : {4, 8})
    for (int group : {32, 64, 128})
      for (ScaleType st : {ScaleType::BF16, ScaleType::F16})
        for (const Shape& s : shapes) {
          const DeviceQuant w = device_quant(rng, s.rows, s.cols, nbits, group, st);
          const Vec x = inputs(rng, size_t(s.T) * s.cols);
          Vec want(size_t(s.T) * s.rows);
          cpu::int_matmul(x.data(), s.T, w.host, want.data());
          DeviceArray<float> dx = dev(x), dy(want.size(), DeviceAlloc::Now);
          int_matmul(dx.data(), s.T, w.device, dy.data());
          const std::vector<uint32_t> got = bits(dy), ref = float_bits(want);
          const size_t i = first_mismatch(got, ref);
          const std::string what = "q" + std::to_string(nbits) + " g" + std::to_string(group) + " " +
                                   scale_type_name(st) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                   " T=" + std::to_string(s.T);
          EXPECT_EQ(i, got.size()) << what << ": output " << i << " differs";
          ++checked;
        }
  std::printf("[cuda-err] int_matmul %d layouts x shapes bit for bit against cpu::int_matmul\n", checked);
}

// Every warp tile (int_gemm.h's IntGemmTiles), loads of a unit together or not, gives the CPU's
// bits: the tile decides which lane sums an output, never the order it is summed in.
TEST(CudaIntGemm, EveryWarpTileGivesTheSameBits) {
  MS_REQUIRE_CUDA();
  Rng rng(13);
  const IntGemmTiles tiles[] = {{1, 4, false}, {1, 4, true}, {1, 2, false}, {1, 2, true},
                                {2, 2, false}, {2, 2, true}, {4, 2, false}, {4, 2, true}};
  int checked = 0;
  for (int nbits : {4, 8})
    for (int group : {32, 64, 128}) {
      const int rows = 200, cols = 512, T = 45;
      const DeviceQuant w = device_quant(rng, rows, cols, nbits, group, ScaleType::BF16);
      const Vec x = inputs(rng, size_t(T) * cols);
      Vec want(size_t(T) * rows);
      cpu::int_matmul(x.data(), T, w.host, want.data());
      const DeviceArray<float> dx = dev(x);
      for (const IntGemmTiles& t : tiles) {
        DeviceArray<float> dy(want.size(), DeviceAlloc::Now);
        int_matmul(dx.data(), T, w.device, dy.data(), t);
        const size_t i = first_mismatch(bits(dy), float_bits(want));
        EXPECT_EQ(i, want.size()) << "q" << nbits << " g" << group << " tile " << t.mt << "x" << t.nt
                                  << (t.unroll ? " unrolled" : "") << ": output " << i << " differs";
        ++checked;
      }
    }
  std::printf("[cuda-err] int_matmul %d layouts x warp tiles bit for bit against cpu::int_matmul\n", checked);
}

TEST(CudaIntGemm, CarriesNaNAndInfinityAsTheCpu) {
  MS_REQUIRE_CUDA();
  Rng rng(12);
  const int rows = 40, cols = 256, T = 20;
  const DeviceQuant w = device_quant(rng, rows, cols, 4, 64, ScaleType::BF16);
  Vec x = rng.normals(size_t(T) * cols);
  x[7] = std::numeric_limits<float>::quiet_NaN();
  x[size_t(3) * cols + 130] = std::numeric_limits<float>::infinity();
  x[size_t(5) * cols + 200] = -std::numeric_limits<float>::infinity();
  x[size_t(9) * cols + 1] = std::ldexp(1.f, -140);  // a subnormal unit maximum beside zeros
  for (int c = 0; c < 64; ++c)
    if (c != 1) x[size_t(9) * cols + c] = 0.f;
  Vec want(size_t(T) * rows);
  cpu::int_matmul(x.data(), T, w.host, want.data());
  DeviceArray<float> dx = dev(x), dy(want.size(), DeviceAlloc::Now);
  int_matmul(dx.data(), T, w.device, dy.data());
  const std::vector<uint32_t> got = bits(dy), ref = float_bits(want);
  const size_t i = first_mismatch(got, ref);
  EXPECT_EQ(i, got.size()) << "output " << i << ": " << std::hex << (i < got.size() ? got[i] : 0) << " against "
                           << (i < got.size() ? ref[i] : 0);
  EXPECT_TRUE(std::isnan(want[0]));
  EXPECT_TRUE(std::isfinite(want[size_t(9) * rows]));
}

// int_experts over random routes (some experts unused, one with more users than a token tile)
// against cpu::int_expert user by user, bit for bit (and other warp tiles likewise); rows of
// `partial` no user names keep their values.
TEST(CudaIntGemm, ExpertsMatchTheCpuExpertBitForBit) {
  MS_REQUIRE_CUDA();
  struct Case {
    int bits_gate_up, bits_down, group, H, I, E, K, T;
    ScaleType st;
  };
  const Case cases[] = {{4, 4, 64, 256, 128, 8, 2, 40, ScaleType::BF16},
                        {8, 4, 32, 128, 96, 6, 3, 33, ScaleType::F16},
                        {4, 8, 128, 512, 256, 5, 2, 17, ScaleType::BF16}};
  Rng rng(13);
  for (const Case& c : cases) {
    std::vector<DeviceQuant> gate, up, down;
    for (int e = 0; e < c.E; ++e) {
      gate.push_back(device_quant(rng, c.I, c.H, c.bits_gate_up, c.group, c.st));
      up.push_back(device_quant(rng, c.I, c.H, c.bits_gate_up, c.group, c.st));
      down.push_back(device_quant(rng, c.H, c.I, c.bits_down, c.group, c.st));
    }
    // Routes: token t's slot k picks expert (t·7 + k·3) % (E − 1), so the last expert has no user
    // and expert 0 more than 16.
    std::vector<std::vector<int>> users(size_t(c.E));
    for (int t = 0; t < c.T; ++t)
      for (int k = 0; k < c.K; ++k) users[size_t((t * 7 + k * 3) % (c.E - 1))].push_back(t * c.K + k);
    std::vector<int> token_rows, user_ids;
    std::vector<float> weights;
    std::vector<size_t> begin, end;
    for (int e = 0; e < c.E; ++e) {
      begin.push_back(user_ids.size());
      for (int u : users[size_t(e)]) token_rows.push_back(u / c.K), user_ids.push_back(u), weights.push_back(rng.uniform(0.1f, 1.f));
      end.push_back(user_ids.size());
    }
    const Vec x = inputs(rng, size_t(c.T) * c.H);
    DeviceArray<float> dx = dev(x);
    const Vec sentinel(size_t(c.T) * c.K * c.H, 12345.f);
    DeviceArray<float> got = dev(sentinel), want = dev(sentinel);
    DeviceArray<int> d_rows = DeviceArray<int>::from(token_rows, DeviceAlloc::Now),
                     d_users = DeviceArray<int>::from(user_ids, DeviceAlloc::Now);
    DeviceArray<float> d_weights = DeviceArray<float>::from(weights, DeviceAlloc::Now);
    std::vector<IntExpertMat> g, u, d;
    for (int e = 0; e < c.E; ++e) {
      auto of = [](const DeviceQuant& m) {
        return IntExpertMat{static_cast<const uint8_t*>(m.device.data), m.device.scales, m.device.biases};
      };
      g.push_back(of(gate[size_t(e)])), u.push_back(of(up[size_t(e)])), d.push_back(of(down[size_t(e)]));
    }
    const IntExperts ie{.n = c.E, .gate = g.data(), .up = u.data(), .down = d.data(), .gate_layout = gate[0].device,
                        .down_layout = down[0].device, .begin = begin.data(), .end = end.data(),
                        .users_total = int(user_ids.size()), .token_rows = d_rows.data(), .users = d_users.data(),
                        .weights = d_weights.data()};
    int_experts(ie, dx.data(), c.T, got.data());
    // Other warp tiles: the same bits.
    std::vector<std::vector<uint32_t>> by_tile;
    for (const IntGemmTiles& t : {IntGemmTiles{1, 4, true}, IntGemmTiles{4, 2, true}}) {
      DeviceArray<float> other = dev(sentinel);
      int_experts(ie, dx.data(), c.T, other.data(), t);
      by_tile.push_back(bits(other));
    }
    // The reference: cpu::int_expert, user by user (the CPU expert of the hybrid decode).
    Vec partial = sentinel;
    for (int e = 0; e < c.E; ++e)
      for (size_t j = begin[size_t(e)]; j < end[size_t(e)]; ++j)
        cpu::int_expert(x.data() + size_t(token_rows[j]) * c.H, gate[size_t(e)].host, up[size_t(e)].host,
                        down[size_t(e)].host, weights[j], partial.data() + size_t(user_ids[j]) * c.H);
    const std::vector<uint32_t> gb = bits(got), wb = float_bits(partial);
    const std::string what = "gate/up q" + std::to_string(c.bits_gate_up) + " down q" + std::to_string(c.bits_down) +
                             " g" + std::to_string(c.group) + " E" + std::to_string(c.E) + " T" + std::to_string(c.T);
    EXPECT_EQ(first_mismatch(gb, wb), gb.size()) << what;
    for (const auto& b : by_tile) EXPECT_EQ(first_mismatch(b, wb), b.size()) << what << ", another warp tile";
  }
}

// A decode token's experts from records (the pools' layout): every slot's row the bits of
// cpu::int_expert on the same record in host memory; a null slot's row left as it was.
TEST(CudaIntGemm, RecordsMatchTheCpuExpertBitForBit) {
  MS_REQUIRE_CUDA();
  struct Case {
    int bits_gate_up, bits_down, group, H, I, K;
    ScaleType st;
  };
  const Case cases[] = {{4, 4, 64, 256, 128, 4, ScaleType::BF16}, {4, 4, 32, 128, 64, 3, ScaleType::F16},
                        {8, 8, 128, 256, 128, 2, ScaleType::BF16}, {8, 4, 64, 128, 192, 5, ScaleType::F16},
                        {4, 8, 32, 128, 64, 3, ScaleType::BF16},  {4, 4, 128, 512, 256, 2, ScaleType::F16}};
  Rng rng(17);
  for (const Case& c : cases) {
    // K records, each gate, up and down with their scales and biases at 16-byte-aligned offsets.
    std::vector<DeviceQuant> parts;
    RecordMat proj[3];
    size_t at = 0;
    auto place = [&](size_t bytes) {
      const size_t p = at;
      at = (at + bytes + 15) / 16 * 16;
      return p;
    };
    const int shapes[3][3] = {{c.I, c.H, c.bits_gate_up}, {c.I, c.H, c.bits_gate_up}, {c.H, c.I, c.bits_down}};
    for (int m = 0; m < 3; ++m) {
      const int rows = shapes[m][0], cols = shapes[m][1], bits = shapes[m][2];
      const size_t words = size_t(rows) * size_t(cols / c.group);
      proj[m] = {.bits = bits, .group = c.group, .rows = rows, .cols = cols};
      proj[m].q_offset = place(size_t(rows) * cols * bits / 8);
      proj[m].scales_offset = place(words * 2);
      proj[m].biases_offset = place(words * 2);
      proj[m].scale_type = c.st;
    }
    const size_t stride = at;
    std::vector<uint8_t> records(stride * size_t(c.K));
    std::vector<std::array<QuantMat, 3>> host_mats;
    for (int k = 0; k < c.K; ++k) {
      std::array<QuantMat, 3> hm;
      for (int m = 0; m < 3; ++m) {
        parts.push_back(device_quant(rng, shapes[m][0], shapes[m][1], shapes[m][2], c.group, c.st));
        const QuantMat& src = parts.back().host;
        uint8_t* rec = records.data() + size_t(k) * stride;
        const size_t words = size_t(src.rows) * size_t(src.groups_per_row());
        std::memcpy(rec + proj[m].q_offset, src.q, src.row_bytes() * size_t(src.rows));
        std::memcpy(rec + proj[m].scales_offset, src.scales, words * 2);
        std::memcpy(rec + proj[m].biases_offset, src.biases, words * 2);
        hm[size_t(m)] = {rec + proj[m].q_offset, reinterpret_cast<const uint16_t*>(rec + proj[m].scales_offset),
                         reinterpret_cast<const uint16_t*>(rec + proj[m].biases_offset), src.rows, src.cols, src.bits,
                         src.group, c.st};
      }
      host_mats.push_back(hm);
    }
    ASSERT_TRUE(int_records_layout(proj));
    DeviceArray<uint8_t> d_records = DeviceArray<uint8_t>::from(records, DeviceAlloc::Now);
    std::vector<const uint8_t*> table;
    for (int k = 0; k < c.K; ++k) table.push_back(k == 1 ? nullptr : d_records.data() + size_t(k) * stride);
    DeviceArray<const uint8_t*> d_table = DeviceArray<const uint8_t*>::from(table, DeviceAlloc::Now);
    std::vector<float> weights;
    for (int k = 0; k < c.K; ++k) weights.push_back(rng.uniform(0.1f, 1.f));
    DeviceArray<float> d_weights = DeviceArray<float>::from(weights, DeviceAlloc::Now);
    const Vec x = inputs(rng, size_t(c.H));
    DeviceArray<float> dx = dev(x);
    const Vec sentinel(size_t(c.K) * c.H, 12345.f);
    DeviceArray<float> got = dev(sentinel);
    DeviceArray<uint8_t> scratch(int_records_scratch_bytes(c.K, proj), DeviceAlloc::Now);
    int_expert_records(dx.data(), c.K, d_table.data(), d_weights.data(), proj, got.data(), scratch.data());
    Vec want = sentinel;
    for (int k = 0; k < c.K; ++k)
      if (k != 1)
        cpu::int_expert(x.data(), host_mats[size_t(k)][0], host_mats[size_t(k)][1], host_mats[size_t(k)][2],
                        weights[size_t(k)], want.data() + size_t(k) * c.H);
    const std::vector<uint32_t> gb = bits(got), wb = float_bits(want);
    EXPECT_EQ(first_mismatch(gb, wb), gb.size())
        << "gate/up q" << c.bits_gate_up << " down q" << c.bits_down << " g" << c.group << " "
        << scale_type_name(c.st) << " K" << c.K;
  }
}

// matmul takes int_matmul where int_matmul_pays (enough tokens and rows × tokens), bit for bit,
// and the decode kernel below.
TEST(CudaIntGemm, MatmulPicksItWhereItPays) {
  MS_REQUIRE_CUDA();
  Rng rng(14);
  const int cols = 256, wide = int(kIntMatmulMinWork / kIntMatmulMinTokens);
  struct Case {
    int rows, T;
  };
  for (const Case c : {Case{wide, kIntMatmulMinTokens - 1}, Case{wide, kIntMatmulMinTokens},
                       Case{200, kIntMatmulMinTokens * 2}, Case{wide / 2, kIntMatmulMinTokens * 2}}) {
    const DeviceQuant w = device_quant(rng, c.rows, cols, 4, 64, ScaleType::BF16);
    const Vec x = rng.normals(size_t(c.T) * cols);
    DeviceArray<float> dx = dev(x), a(size_t(c.T) * c.rows, DeviceAlloc::Now), b(size_t(c.T) * c.rows, DeviceAlloc::Now);
    matmul(dx.data(), c.T, w.device, a.data());
    int_matmul(dx.data(), c.T, w.device, b.data());
    const std::string what = std::to_string(c.rows) + " rows, T " + std::to_string(c.T);
    if (int_matmul_pays(w.device, c.T))
      EXPECT_EQ(bits(a), bits(b)) << what;
    else
      EXPECT_NE(bits(a), bits(b)) << what << ": the decode kernel's sums are in another order";
  }
  EXPECT_FALSE(int_matmul_pays(device_quant(rng, wide, cols, 4, 64, ScaleType::BF16).device, kIntMatmulMinTokens - 1));
  EXPECT_TRUE(int_matmul_pays(device_quant(rng, wide, cols, 4, 64, ScaleType::BF16).device, kIntMatmulMinTokens));
  EXPECT_FALSE(int_matmul_pays(device_quant(rng, 200, cols, 4, 64, ScaleType::BF16).device, 2 * kIntMatmulMinTokens));
}

TEST(CudaIntGemm, RefusesOtherLayouts) {
  MS_REQUIRE_CUDA();
  Rng rng(15);
  const DeviceQuant w3 = device_quant(rng, 16, 128, 3, 64, ScaleType::BF16);
  EXPECT_FALSE(int_gemm_layout(w3.device));
  DeviceArray<float> x(size_t(16) * 128, DeviceAlloc::Now), y(size_t(16) * 16, DeviceAlloc::Now);
  try {
    int_matmul(x.data(), 16, w3.device, y.data());
    ADD_FAILURE() << "3-bit weights ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3-bit group 64"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ms::cuda::test
