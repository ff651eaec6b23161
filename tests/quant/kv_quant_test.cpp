// The KV cache's formats (quant/kv_quant.h): half rounding, each side's encoding and its error
// bound, the rotations' orthogonality, and the flags' parsing.
#include "quant/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "util/half.h"

namespace ms {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Every finite half round-trips, and the midpoint of two neighbours rounds to the even one.
TEST(KvQuant, HalfRoundsToNearestEvenAndSaturates) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf and NaN
    const float f = f16_to_f32(f16(h));
    ASSERT_EQ(f32_to_f16(f), f16(h)) << std::hex << h;
    if ((h & 0x7fff) == 0x7bff) continue;  // the largest: no finite neighbour above
    const double mid = (double(f) + double(f16_to_f32(f16(h + 1)))) / 2;
    if (float(mid) != mid) continue;  // not exact in float
    const f16 even = (h & 1) ? f16(h + 1) : f16(h);
    ASSERT_EQ(f32_to_f16(float(mid)), even) << std::hex << h;
  }
  EXPECT_EQ(f32_to_f16(1.f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e9f), 0x7bff);    // saturates
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfbff);
  EXPECT_EQ(f32_to_f16(1e-9f), 0x0000);   // below half the smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -24)), 0x0001);
}

// Each quantized value is within half a step (its group's scale) of the input, plus the rounding
// of scale·q + bias; bf16 rounds each value; float32 is a copy.
TEST(KvQuant, EncodedRowsDecodeWithinHalfAStep) {
  for (const int hd : {64, 128, 256})
    for (const int bits : {8, 4, 3, 2})
      for (const int group : {32, 64, 128}) {
        if (hd % group) continue;
        const KvSide s{bits, group};
        const std::vector<float> x = randn(size_t(hd), uint32_t(hd + bits + group), 3.f);
        std::vector<uint8_t> row(s.row_bytes(hd));
        ASSERT_EQ(row.size(), size_t(hd * bits / 8 + 4 * (hd / group)));
        kv_encode(s, x.data(), hd, row.data());
        std::vector<float> y(static_cast<size_t>(hd));
        kv_decode(s, row.data(), hd, y.data());
        for (int i = 0; i < hd; ++i) {
          f16 scale;
          std::memcpy(&scale, row.data() + hd * bits / 8 + 2 * (i / group), 2);
          const float step = f16_to_f32(scale);
          ASSERT_GT(step, 0.f);
          // half of a step, and the bias's half rounding where it cuts the lowest value
          ASSERT_LE(std::abs(y[size_t(i)] - x[size_t(i)]), step / 2 + 1e-3f * std::abs(x[size_t(i)]) + 1e-5f)
              << "bits " << bits << " group " << group << " at " << i;
        }
      }
  const std::vector<float> x = randn(64, 1);
  std::vector<uint8_t> row(KvSide{16}.row_bytes(64));
  std::vector<float> y(64);
  kv_encode(KvSide{16}, x.data(), 64, row.data());
  kv_decode(KvSide{16}, row.data(), 64, y.data());
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(y[i], bf16_to_f32(f32_to_bf16(x[i])));
  row.resize(KvSide{32}.row_bytes(64));
  kv_encode(KvSide{32}, x.data(), 64, row.data());
  kv_decode(KvSide{32}, row.data(), 64, y.data());
  EXPECT_EQ(y, x);
}

TEST(KvQuant, AConstantGroupIsExact) {
  std::vector<float> x(64, 0.375f);
  std::vector<uint8_t> row(KvSide{4, 64}.row_bytes(64));
  kv_encode(KvSide{4, 64}, x.data(), 64, row.data());
  std::vector<float> y(64);
  kv_decode(KvSide{4, 64}, row.data(), 64, y.data());
  EXPECT_EQ(y, x);
}

// R·Rᵀ = I to float rounding, undo inverts apply, the So4 blocks are rotations (det +1), and a
// seed fixes the map.
TEST(KvQuant, RotationsAreOrthogonalAndFixedBySeed) {
  for (const KvRotation kind : {KvRotation::So4, KvRotation::Hadamard})
    for (const int hd : {64, 256}) {
      const KvRotator r(kind, hd);
      std::vector<float> m(size_t(hd) * hd, 0.f);  // row i: R·e_i, column i of R
      for (int i = 0; i < hd; ++i) m[size_t(i) * hd + i] = 1.f;
      r.apply(m.data(), size_t(hd));
      for (int i = 0; i < hd; ++i)
        for (int j = 0; j < hd; ++j) {
          double d = 0;
          for (int k = 0; k < hd; ++k) d += double(m[size_t(i) * hd + k]) * m[size_t(j) * hd + k];
          ASSERT_NEAR(d, i == j ? 1.0 : 0.0, 1e-6) << kv_rotation_name(kind) << " " << i << "," << j;
        }
      const std::vector<float> x = randn(size_t(hd) * 3, 4);
      std::vector<float> y = x;
      r.apply(y.data(), 3);
      EXPECT_NE(y, x);
      r.undo(y.data(), 3);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5) << kv_rotation_name(kind);
      std::vector<float> once = x, again = x, other = x;
      r.apply(once.data(), 3);
      KvRotator(kind, hd).apply(again.data(), 3);
      KvRotator(kind, hd, 7).apply(other.data(), 3);
      EXPECT_EQ(again, once);
      EXPECT_NE(other, once);
    }
  const KvRotator so4(KvRotation::So4, 16);
  for (int b = 0; b < 4; ++b) {
    const float* m = so4.blocks().data() + 16 * b;
    auto det3 = [&](int skip_col) {  // the minor of row 0 without column skip_col
      int c[3], n = 0;
      for (int j = 0; j < 4; ++j)
        if (j != skip_col) c[n++] = j;
      auto at = [&](int r, int k) { return double(m[4 * r + c[k]]); };
      return at(1, 0) * (at(2, 1) * at(3, 2) - at(2, 2) * at(3, 1)) - at(1, 1) * (at(2, 0) * at(3, 2) - at(2, 2) * at(3, 0)) +
             at(1, 2) * (at(2, 0) * at(3, 1) - at(2, 1) * at(3, 0));
    };
    double det = 0;
    for (int j = 0; j < 4; ++j) det += (j % 2 ? -1 : 1) * double(m[j]) * det3(j);
    EXPECT_NEAR(det, 1.0, 1e-5) << "block " << b;
  }
  EXPECT_THROW(KvRotator(KvRotation::Hadamard, 96), std::exception);
  EXPECT_THROW(KvRotator(KvRotation::So4, 66), std::exception);
}

// A row with an outlying dimension (what keys often have) loses less to 4 bits once the Hadamard
// rotation has spread the outlier over the head.
TEST(KvQuant, HadamardShrinksTheErrorOfAnOutlier) {
  const int hd = 128;
  const KvSide s{4, 64};
  const KvRotator r(KvRotation::Hadamard, hd);
  double plain = 0, rotated = 0;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> x = randn(size_t(hd), seed);
    x[size_t(seed % hd)] = 40.f;
    std::vector<uint8_t> row(s.row_bytes(hd));
    std::vector<float> y(static_cast<size_t>(hd)), xr = x;
    kv_encode(s, x.data(), hd, row.data());
    kv_decode(s, row.data(), hd, y.data());
    for (int i = 0; i < hd; ++i) plain += std::pow(double(y[size_t(i)]) - x[size_t(i)], 2);
    r.apply(xr.data(), 1);
    kv_encode(s, xr.data(), hd, row.data());
    kv_decode(s, row.data(), hd, y.data());
    r.undo(y.data(), 1);
    for (int i = 0; i < hd; ++i) rotated += std::pow(double(y[size_t(i)]) - x[size_t(i)], 2);
  }
  EXPECT_LT(rotated, plain / 2);
}

TEST(KvQuant, FlagsParseAndBadOnesNameTheFlag) {
  KvFormat f;
  parse_kv_bits("4,3", f);
  EXPECT_EQ(f.k.bits, 4);
  EXPECT_EQ(f.v.bits, 3);
  EXPECT_EQ(f.describe(), "K4/V3 g64 hadamard");
  parse_kv_bits("16", f);
  EXPECT_EQ(f.k.bits, 16);
  EXPECT_EQ(f.v.bits, 16);
  EXPECT_EQ(f.describe(), "bf16");
  parse_kv_bits("32,32", f);
  EXPECT_TRUE(f.exact());
  EXPECT_EQ(f.describe(), "float32");
  EXPECT_EQ(f.bytes_per_position(2, 256), 2u * 2 * 256 * 4);
  parse_kv_bits("4,3", f);
  EXPECT_EQ(f.bytes_per_position(2, 256), 2u * ((128 + 16) + (96 + 16)));
  for (const char* bad : {"5,3", "4,", ",4", "x", "4,3,2", "", "100"}) {
    try {
      parse_kv_bits(bad, f);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-bits"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_kv_rotation("hadamard"), KvRotation::Hadamard);
  EXPECT_THROW(parse_kv_rotation("so3"), std::exception);
  EXPECT_THROW(check_kv_side(KvSide{4, 48}, 96, "test"), std::exception);
  EXPECT_THROW(check_kv_side(KvSide{4, 128}, 64, "test"), std::exception);
}

}  // namespace
}  // namespace ms
