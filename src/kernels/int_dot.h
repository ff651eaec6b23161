#pragma once
// The integer dot product of an affine row with x, defined once so that every kernel that
// computes it (cpu::int_matmul, cuda::int_gemm) gives the same bits on every device.
//
// x is split into units of `unit` values (the weights' group): each unit's values become 30-bit
// integers X = rint(x·2^-e), e = ilogb(max |x|) − 29 (mma_dot.cuh's split: exact for every value
// within 2^30 of the unit's largest), written as four balanced signed bytes. For a row of codes q
// with a scale s and a bias b per group, each unit contributes its exact integer sum
// D = Σ q·X (the four bytes' int32 sums, each exact, meet in int64) and b·Σx:
//   acc = fma(float(D), s·2^e, acc);  acc = fma(b, Σx, acc)
// unit after unit, from acc = 0, Σx summed left to right in float. A unit holding a NaN or an
// infinity has X = 0 and 2^e = NaN, so every row it meets is NaN. Any device computes D however
// it likes (it is exact) and then takes these float steps in this order.
//
// Layouts: 4 or 8 bits, groups of 32, 64 or 128, bf16 or f16 scales (int_dot_layout). The bytes
// of a chunk of 32 values are stored in the order the integer tensor cores take a chunk's codes
// (slot_of), four parts interleaved: [chunk][quad of 4 slots][part][4 bytes], 128 bytes a chunk.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant/affine.h"

#if defined(__CUDACC__)
#define MS_INT_DOT_FN __host__ __device__ inline
#else
#define MS_INT_DOT_FN inline
#endif

namespace ms::int_dot {

inline constexpr int kChunk = 32;                   // values a slot order spans
inline constexpr int kParts = 4;                    // signed bytes of X
inline constexpr int kChunkBytes = kChunk * kParts;  // a chunk of x, split

inline bool layout_supported(int bits, int group, ScaleType st) {
  return (bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128) && st != ScaleType::F32;
}

// The slot (k index of the tensor cores' 32) of code c of a chunk. At 8 bits a lane's words are
// codes in order; at 4 bits lane t's word t holds codes 8t..8t+7 as nibbles, its low nibbles
// (codes 8t, 8t+2, ...) going to slots 4t.. and its high ones to slots 16 + 4t...
MS_INT_DOT_FN constexpr int slot_of(int bits, int c) {
  if (bits == 8) return c;
  return (c & 1) * 16 + (c >> 3) * 4 + ((c >> 1) & 3);
}

// The code index of slot s (slot_of's inverse).
MS_INT_DOT_FN constexpr int code_of_slot(int bits, int s) {
  if (bits == 8) return s;
  return ((s & 15) >> 2) * 8 + (s & 3) * 2 + (s >> 4);
}

// Byte offset of part p of slot s in a split chunk.
MS_INT_DOT_FN constexpr int byte_of(int s, int p) { return (s >> 2) * 16 + p * 4 + (s & 3); }

MS_INT_DOT_FN float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

MS_INT_DOT_FN uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// e for a unit whose largest magnitude is mx (finite): ilogb(mx) − 29 from the exponent bits, no
// less than −149 (a subnormal mx, bits 0, gives −156, clamped as ilogb's would be); 0 for mx = 0.
MS_INT_DOT_FN int unit_exponent(float mx) {
  if (!(mx > 0.f)) return 0;
  const int e = int(float_bits(mx) >> 23) - 127 - 29;
  return e < -149 ? -149 : e;
}

// 2^e as a float, e in [−149, 127].
MS_INT_DOT_FN float pow2(int e) {
  return e >= -126 ? bits_float(uint32_t(127 + e) << 23) : bits_float(1u << (e + 149));
}

// The two normal halves of 2^-e (x·h1·h2 = x·2^-e, each product exact), e in [−149, 98].
MS_INT_DOT_FN float half_scale1(int e) { return bits_float(uint32_t(127 + -e / 2) << 23); }
MS_INT_DOT_FN float half_scale2(int e) { return bits_float(uint32_t(127 + -e - -e / 2) << 23); }

// The float steps of the expert's activation, the same on every device: on the GPU as the
// round-to-nearest intrinsics (nothing contracted into an FMA), on the host as plain operations
// (its callers compile without contraction: kernels/cpu/int_expert.cpp).
#if defined(__CUDA_ARCH__)
#define MS_FMUL(a, b) __fmul_rn(a, b)
#define MS_FADD(a, b) __fadd_rn(a, b)
#define MS_FDIV(a, b) __fdiv_rn(a, b)
#define MS_RINT(a) rintf(a)
#define MS_FMA(a, b, c) fmaf(a, b, c)
#else
#define MS_FMUL(a, b) ((a) * (b))
#define MS_FADD(a, b) ((a) + (b))
#define MS_FDIV(a, b) ((a) / (b))
#define MS_RINT(a) std::nearbyint(a)
#define MS_FMA(a, b, c) std::fma(a, b, c)
#endif

// exp(a) for a <= 0 (NaN stays NaN) within about an ulp: a = k·ln2 + r with |r| <= ln2/2 (ln2 in
// two parts, the first exact times any k here), e^r by its Taylor polynomial of degree 7 (error
// below 2^-27 of it), then times 2^k (k >= -149: a normal or subnormal power of two, one rounding).
MS_INT_DOT_FN float exp_nonpositive(float a) {
  if (!(a > -103.5f)) return a != a ? a : 0.f;  // e^-103.5 rounds to 0
  const float k = MS_RINT(MS_FMUL(a, 1.44269502f));
  float r = MS_FMA(k, -0.693145751953125f, a);
  r = MS_FMA(k, -1.42860677e-06f, r);
  float p = 1.98412698e-04f;  // 1/5040
  p = MS_FMA(p, r, 1.38888889e-03f);
  p = MS_FMA(p, r, 8.33333377e-03f);
  p = MS_FMA(p, r, 4.16666679e-02f);
  p = MS_FMA(p, r, 0.166666672f);
  p = MS_FMA(p, r, 0.5f);
  p = MS_FMA(p, r, 1.0f);
  p = MS_FMA(p, r, 1.0f);
  return MS_FMUL(p, pow2(int(k)));
}

// silu(x) = x·sigmoid(x) from e = exp(−|x|), so that nothing overflows: sigmoid is 1/(1 + e) for
// x >= 0 and e/(1 + e) below. The routed experts' activation wherever a CPU and a GPU expert must
// agree bit for bit (cuda::int_experts, cpu::int_expert).
MS_INT_DOT_FN float silu(float x) {
  const float e = exp_nonpositive(-(x < 0.f ? -x : x));
  const float r = MS_FDIV(1.0f, MS_FADD(1.0f, e));
  return MS_FMUL(x, x < 0.f ? MS_FMUL(e, r) : r);
}

#undef MS_FMUL
#undef MS_FADD
#undef MS_FDIV
#undef MS_RINT
#undef MS_FMA

// Whether gate, up and down (each of a supported layout) form one expert the integer expert
// kernels take: gate and up of one layout and shape [I, H], down [H, I]. M: QuantMat or cuda::Mat.
template <class M>
bool expert_shapes_match(const M& gate, const M& up, const M& down) {
  return gate.bits == up.bits && gate.group == up.group && gate.scale_type == up.scale_type && gate.rows == up.rows &&
         gate.cols == up.cols && down.rows == gate.cols && down.cols == gate.rows;
}

// X's balanced base-256 digits, byte p of the result the signed digit p (mma_dot.cuh's digits).
MS_INT_DOT_FN uint32_t digits(int32_t X) { return (uint32_t(X) + 0x808080u) ^ 0x808080u; }

// D from the four parts' exact int32 sums c[p] = Σ q·digit_p.
MS_INT_DOT_FN int64_t combine(int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  const int32_t lo = c0 + 256 * c1, hi = c2 + 256 * c3;  // each exact: |c_p| < 2^22
  return int64_t(hi) * 65536 + lo;
}

}  // namespace ms::int_dot
