#include "quant/affine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "util/error.h"
#include "util/half.h"

namespace ms {
namespace {

std::vector<uint8_t> random_values(size_t n, int bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, (1 << bits) - 1);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = uint8_t(dist(rng));
  return v;
}

TEST(PackBits, RoundTripEveryWidthAndOffset) {
  for (int bits : {2, 3, 4, 8}) {
    for (size_t n : {1u, 7u, 8u, 9u, 31u, 64u, 257u}) {
      std::vector<uint8_t> values = random_values(n, bits, uint32_t(bits * 1000 + n));
      std::vector<uint8_t> packed((n * size_t(bits) + 7) / 8 + 1, 0xAB);
      pack_bits(values.data(), n, bits, packed.data());
      EXPECT_EQ(packed.back(), 0xAB) << "pack_bits wrote past ceil(n*bits/8) bytes";
      // Every start offset, odd ones included (3-bit values straddle bytes there).
      for (size_t first = 0; first < n; ++first) {
        std::vector<uint8_t> back(n - first);
        unpack_bits(packed.data(), first, n - first, bits, back.data());
        for (size_t i = 0; i < back.size(); ++i)
          ASSERT_EQ(back[i], values[first + i]) << "bits " << bits << " n " << n << " first " << first << " i " << i;
      }
    }
  }
}

// Bit-level layout written out by hand: value i occupies bits [3i, 3i+3) of the stream.
TEST(PackBits, ThreeBitLayout) {
  const uint8_t values[8] = {1, 2, 3, 4, 5, 6, 7, 0};
  uint32_t stream = 0;
  for (int i = 0; i < 8; ++i) stream |= uint32_t(values[i]) << (3 * i);
  uint8_t packed[3];
  pack_bits(values, 8, 3, packed);
  EXPECT_EQ(packed[0], uint8_t(stream));
  EXPECT_EQ(packed[1], uint8_t(stream >> 8));
  EXPECT_EQ(packed[2], uint8_t(stream >> 16));
}

TEST(PackBits, RejectsOutOfRangeValue) {
  const uint8_t values[2] = {3, 4};
  uint8_t out[1];
  EXPECT_THROW(pack_bits(values, 2, 2, out), Error);
}

// MLX packs 4-bit values eight to a uint32: value i of a word sits at bits 4·(i % 8). On a
// little-endian machine the bytes of those words are our stream.
TEST(PackBits, FourBitMatchesMlxUint32Words) {
  const int n = 32;
  std::vector<uint8_t> values = random_values(n, 4, 7);
  uint32_t words[n / 8] = {};
  for (int i = 0; i < n; ++i) words[i / 8] |= uint32_t(values[size_t(i)]) << (4 * (i % 8));
  std::vector<uint8_t> packed(n / 2);
  pack_bits(values.data(), n, 4, packed.data());
  for (int w = 0; w < n / 8; ++w)
    for (int b = 0; b < 4; ++b) EXPECT_EQ(packed[size_t(w * 4 + b)], uint8_t(words[w] >> (8 * b))) << w << " " << b;
  // A hand-made word: 0x76543210 holds 0,1,...,7.
  const uint8_t word_bytes[4] = {0x10, 0x32, 0x54, 0x76};
  uint8_t back[8];
  unpack_bits(word_bytes, 0, 8, 4, back);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(back[i], i);
}

TEST(Quantize, KnownAnswer) {
  // One group of 32: values 0, 0.5, ..., 15.5 at 4 bits → bias 0, scale 31/30 rounded up to bf16.
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[size_t(i)] = 0.5f * float(i);
  QuantBuffer qb = quantize(w.data(), 1, 32, 4, 32);
  EXPECT_EQ(bf16_to_f32(qb.biases[0]), 0.0f);
  float scale = bf16_to_f32(qb.scales[0]);
  EXPECT_GE(scale * 15.0f, 15.5f);
  EXPECT_EQ(scale, 1.0390625f);  // 15.5/15 = 1.0333.. rounded up to a multiple of 2^-7
  std::vector<float> out(32);
  dequantize_row(qb.view(), 0, out.data());
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(out[size_t(i)] - w[size_t(i)]), scale / 2) << i;
}

TEST(Quantize, ConstantAndZeroGroupsAreExactOrNearlySo) {
  std::vector<float> w(64, 0.0f);
  for (int i = 32; i < 64; ++i) w[size_t(i)] = 0.1f;  // not representable in bf16
  QuantBuffer qb = quantize(w.data(), 1, 64, 2, 32);
  std::vector<float> out(64);
  dequantize_row(qb.view(), 0, out.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[size_t(i)], 0.0f);
  // bf16(0.1) is off by ~2e-4; the scale spreads the rounding gap of the bias over qmax levels.
  float scale = bf16_to_f32(qb.scales[1]);
  EXPECT_LE(scale, std::ldexp(0.1, -7) / 3 * (1 + std::ldexp(1.0, -7)));
  for (int i = 32; i < 64; ++i) EXPECT_LE(std::fabs(out[size_t(i)] - 0.1f), scale / 2);
}

TEST(Quantize, RejectsBadParameters) {
  std::vector<float> w(256, 1.0f);
  EXPECT_THROW(quantize(w.data(), 1, 256, 7, 64), Error);
  EXPECT_THROW(quantize(w.data(), 1, 256, 3, 16), Error);
  EXPECT_THROW(quantize(w.data(), 1, 256, 4, 48), Error);
  EXPECT_THROW(quantize(w.data(), 1, 96, 4, 64), Error);
  w[3] = NAN;
  EXPECT_THROW(quantize(w.data(), 1, 256, 4, 64), Error);
  try {
    quantize(w.data(), 1, 256, 7, 64);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bits must be 2, 3, 4, 5, 6 or 8, got 7"), std::string::npos) << e.what();
  }
}

// Error bound, per group with lo/hi its min/max and qmax = 2^bits − 1:
//  - bias = bf16(lo) rounded down, scale = bf16((hi − bias)/qmax) rounded up, so every weight
//    lies in [bias, bias + scale·qmax] and the nearest level is within scale/2 of it;
//  - directed bf16 rounding costs less than one bf16 ulp (2^-7 relative) each, so
//    scale ≤ (hi − lo + 2^-7·|lo|)/qmax · (1 + 2^-7);
//  - evaluating scale·q + bias in float adds at most 2^-23·(scale·q + |bias|).
TEST(Quantize, ErrorBoundsPerBitWidthAndRms) {
  const int rows = 64, cols = 1024;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(size_t(rows) * cols);
  for (auto& x : w) x = normal(rng);
  for (int i = 0; i < cols; ++i) w[size_t(i)] += 3.0f;  // a row offset from zero: bias far from 0
  for (int bits : {2, 3, 4, 8}) {
    for (int group : {32, 64, 128}) {
      QuantBuffer qb = quantize(w.data(), rows, cols, bits, group);
      const QuantMat m = qb.view();
      ASSERT_EQ(qb.q.size(), size_t(rows) * size_t(cols) * size_t(bits) / 8);
      const int qmax = (1 << bits) - 1, groups = cols / group;
      std::vector<float> out(static_cast<size_t>(cols));
      double sq = 0;
      for (int r = 0; r < rows; ++r) {
        dequantize_row(m, r, out.data());
        for (int g = 0; g < groups; ++g) {
          const float* gw = &w[size_t(r) * cols + size_t(g) * group];
          float lo = gw[0], hi = gw[0];
          for (int i = 0; i < group; ++i) lo = std::min(lo, gw[i]), hi = std::max(hi, gw[i]);
          double scale = bf16_to_f32(m.scales[size_t(r) * groups + size_t(g)]);
          double bias = bf16_to_f32(m.biases[size_t(r) * groups + size_t(g)]);
          EXPECT_LE(bias, lo);
          EXPECT_LE(scale, (double(hi) - lo + std::ldexp(std::fabs(lo), -7)) / qmax * (1 + std::ldexp(1.0, -7)));
          for (int i = 0; i < group; ++i) {
            double d = out[size_t(g) * group + size_t(i)];
            double err = std::fabs(d - gw[i]);
            double bound = scale / 2 + std::ldexp(std::fabs(d - bias) + std::fabs(bias), -23);
            ASSERT_LE(err, bound) << "bits " << bits << " group " << group << " row " << r << " col "
                                  << g * group + i;
            sq += err * err;
          }
        }
      }
      double rms = std::sqrt(sq / double(w.size()));
      std::printf("[ rms      ] bits %d group %3d: RMS error %.5f on N(0,1) weights\n", bits, group, rms);
      // Rounding error is about uniform on ±scale/2 (RMS scale/√12); 128 N(0,1) samples rarely
      // span more than 6.5.
      EXPECT_LT(rms, 6.5 / (qmax * std::sqrt(12.0)));
    }
  }
}

}  // namespace
}  // namespace ms
