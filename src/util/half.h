#pragma once
// bfloat16 / float16 <-> float32 conversions.
#include <cstdint>
#include <cstring>

namespace ms {

using bf16 = uint16_t;  // raw bfloat16 bits
using f16 = uint16_t;   // raw IEEE half bits

inline float bf16_to_f32(bf16 v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN kept quiet (what torch does).
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16(u >> 16);
}

inline float f16_to_f32(f16 h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; beyond the largest finite half (65504) saturates to it, NaN stays a
// quiet NaN. What CUDA's __float2half_rn gives for a value clamped to ±65504 first.
inline f16 f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16(sign | 0x7e00u);
  if (a >= 0x477fe000u) return f16(sign | 0x7bffu);  // rounds to 65536 or beyond: saturate
  if (a < 0x38800000u) {                              // below the smallest normal half: subnormal or 0
    if (a < 0x33000000u) return f16(sign);             // under half the smallest subnormal
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - int(a >> 23);  // 14 .. 24
    const uint32_t q = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    return f16(sign | (q + (rest > half || (rest == half && (q & 1u)))));
  }
  const uint32_t base = a - 0x38000000u;  // rebias 127 -> 15, still 23 mantissa bits
  const uint32_t q = base >> 13, rest = base & 0x1fffu;
  return f16(sign | (q + (rest > 0x1000u || (rest == 0x1000u && (q & 1u)))));
}

}  // namespace ms
