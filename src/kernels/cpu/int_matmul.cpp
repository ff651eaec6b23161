// cpu::int_matmul: kernels/int_dot.h's product. x is split once a call, int_matmul_each's for
// all its matrices (a token's units: X, 2^e, Σx, scalar as the definition reads), and X cut into
// two int16 halves, X = 32768·hi + lo with lo in [0, 32768) (|X| < 2^30: hi fits too). A row's unit of codes is widened to int16 once for all
// tokens; each token's D is then two sums of int16 products in int32 lanes (vpmaddwd on x86,
// vpdpwssd with AVX-512 VNNI: a product < 2^23, a unit's sum < 2^30, exact) that meet in int64, and the float steps follow in
// the definition's order. 4-bit codes are taken a vector of bytes at a time, low nibbles then high
// ones, and x's halves are stored in that order (a block of 2N codes: the even ones, then the odd).
#include "kernels/cpu/int_matmul.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/int_dot.h"
#include "util/error.h"
#include "util/thread_pool.h"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
// AVX-512 VNNI (AVX3_DL): a unit's int16 products summed by vpdpwssd.
#define HWY_WANT_AVX3_DL 1
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/int_matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#ifndef MS_INT_MATMUL_ONCE
#define MS_INT_MATMUL_ONCE
namespace ms::cpu {
namespace {

// One unit of n values of x: its X, 2^e and Σx.
void split_unit(const float* x, int n, int32_t* X, float* pow2, float* xsum) {
  float mx = 0.f, sum = 0.f;
  for (int i = 0; i < n; ++i) {
    mx = std::fmax(mx, std::fabs(x[i]));  // fmax drops NaNs: they show in the sum
    sum += x[i];
  }
  const bool finite = std::isfinite(mx) && std::isfinite(sum);
  const int e = finite ? int_dot::unit_exponent(mx) : 0;
  *pow2 = finite ? int_dot::pow2(e) : std::numeric_limits<float>::quiet_NaN();
  *xsum = sum;
  const float h1 = int_dot::half_scale1(e), h2 = int_dot::half_scale2(e);
  for (int i = 0; i < n; ++i) X[i] = finite ? int32_t(std::nearbyint(x[i] * h1 * h2)) : 0;
}

}  // namespace

IntSplit int_split(const float* x, int n, int cols, int unit) {
  IntSplit s;
  s.rows = n, s.cols = cols, s.unit = unit;
  const int units = cols / unit;
  s.X.resize(size_t(n) * size_t(cols));
  s.pow2.resize(size_t(n) * size_t(units));
  s.xsum.resize(s.pow2.size());
  for (int t = 0; t < n; ++t)
    for (int u = 0; u < units; ++u) {
      const size_t at = size_t(t) * size_t(cols) + size_t(u) * size_t(unit), k = size_t(t) * size_t(units) + size_t(u);
      split_unit(x + at, unit, s.X.data() + at, &s.pow2[k], &s.xsum[k]);
    }
  return s;
}

bool int_matmul_supported(const QuantMat& W) {
  return int_dot::layout_supported(W.bits, W.group, W.scale_type) && W.cols % W.group == 0;
}

}  // namespace ms::cpu
#endif  // MS_INT_MATMUL_ONCE

HWY_BEFORE_NAMESPACE();
namespace ms::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// int16 vectors of at most 16 lanes: a block of 4-bit codes (2N) then stays within a group of 32.
using D16 = hn::CappedTag<int16_t, 16>;

// x split, and X's halves in the order a row's codes are widened.
struct IntInput {
  IntSplit split;
  std::vector<int16_t> lo, hi;  // [T][cols]
};

void PrepareInput(const float* x, int T, const QuantMat& W, IntInput& in) {
  in.split = int_split(x, T, W.cols, W.group);
  const size_t n = size_t(T) * size_t(W.cols), N = hn::Lanes(D16());
  in.lo.resize(n), in.hi.resize(n);
  for (size_t i = 0; i < n; ++i) {
    // Position of value i among the widened codes: within each block of 2N codes of a 4-bit row,
    // the even codes first.
    size_t at = i;
    if (W.bits == 4) {
      const size_t j = i % (2 * N);
      at = i - j + (j % 2) * N + j / 2;
    }
    const int32_t X = in.split.X[i];
    in.lo[at] = int16_t(X & 0x7fff), in.hi[at] = int16_t(X >> 15);
  }
}

// The unit of codes at `codes` (group of them) widened to int16 into q, in the input's order.
template <int kBits>
HWY_INLINE void WidenUnit(const uint8_t* codes, int group, int16_t* HWY_RESTRICT q) {
  const D16 d16;
  const hn::Rebind<uint8_t, D16> d8;
  const size_t N = hn::Lanes(d16);
  if constexpr (kBits == 8) {
    for (size_t i = 0; i < size_t(group); i += N) hn::Store(hn::BitCast(d16, hn::PromoteTo(hn::Rebind<uint16_t, D16>(), hn::LoadU(d8, codes + i))), d16, q + i);
  } else {
    const auto mask = hn::Set(d8, uint8_t(15));
    for (size_t i = 0; i < size_t(group); i += 2 * N) {
      const auto bytes = hn::LoadU(d8, codes + i / 2);
      const hn::Rebind<uint16_t, D16> du16;
      hn::Store(hn::BitCast(d16, hn::PromoteTo(du16, hn::And(bytes, mask))), d16, q + i);
      hn::Store(hn::BitCast(d16, hn::PromoteTo(du16, hn::ShiftRight<4>(bytes))), d16, q + i + N);
    }
  }
}

// Σ q·v over n int16 values (a unit): exact in int32 (int_matmul.cpp's bounds).
HWY_INLINE int32_t DotUnit(const int16_t* HWY_RESTRICT q, const int16_t* HWY_RESTRICT v, int n) {
  const D16 d16;
  const hn::Repartition<int32_t, D16> d32;
  auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
#if HWY_TARGET == HWY_AVX3_DL
  // vpdpwssd: adjacent int16 products summed into each int32 lane, as madd + add does (exact).
  for (size_t i = 0; i < size_t(n); i += hn::Lanes(d16))
    s0 = decltype(s0){_mm256_dpwssd_epi32(s0.raw, hn::Load(d16, q + i).raw, hn::LoadU(d16, v + i).raw)};
#else
  for (size_t i = 0; i < size_t(n); i += hn::Lanes(d16))
    s0 = hn::ReorderWidenMulAccumulate(d32, hn::Load(d16, q + i), hn::LoadU(d16, v + i), s0, s1);
#endif
  return hn::GetLane(hn::SumOfLanes(d32, hn::Add(s0, s1)));
}

// Σ q·lo and Σ q·hi over n int16 values (a unit) in one pass over q: exact in int32 each.
HWY_INLINE void DotUnitPair(const int16_t* HWY_RESTRICT q, const int16_t* HWY_RESTRICT lo,
                            const int16_t* HWY_RESTRICT hi, int n, int32_t* sum_lo, int32_t* sum_hi) {
  const D16 d16;
  const hn::Repartition<int32_t, D16> d32;
  auto a0 = hn::Zero(d32), a1 = hn::Zero(d32), b0 = hn::Zero(d32), b1 = hn::Zero(d32);
  for (size_t i = 0; i < size_t(n); i += hn::Lanes(d16)) {
    const auto qv = hn::Load(d16, q + i);
#if HWY_TARGET == HWY_AVX3_DL
    a0 = decltype(a0){_mm256_dpwssd_epi32(a0.raw, qv.raw, hn::LoadU(d16, lo + i).raw)};
    b0 = decltype(b0){_mm256_dpwssd_epi32(b0.raw, qv.raw, hn::LoadU(d16, hi + i).raw)};
#else
    a0 = hn::ReorderWidenMulAccumulate(d32, qv, hn::LoadU(d16, lo + i), a0, a1);
    b0 = hn::ReorderWidenMulAccumulate(d32, qv, hn::LoadU(d16, hi + i), b0, b1);
#endif
  }
  a0 = hn::Add(a0, a1), b0 = hn::Add(b0, b1);
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // Both sums at once (8 lanes): interleaved within each 128-bit block and added, the halves
  // added, then the two 64-bit halves: lane 0 holds Σlo, lane 1 Σhi.
  const hn::Half<decltype(d32)> d4;
  const auto v = hn::Add(hn::InterleaveLower(d32, a0, b0), hn::InterleaveUpper(d32, a0, b0));
  const auto w = hn::Add(hn::LowerHalf(d4, v), hn::UpperHalf(d4, v));
  const auto z = hn::Add(w, hn::Shuffle1032(w));
  *sum_lo = hn::GetLane(z);
  *sum_hi = hn::ExtractLane(z, 1);
#else
  *sum_lo = hn::GetLane(hn::SumOfLanes(d32, a0));
  *sum_hi = hn::GetLane(hn::SumOfLanes(d32, b0));
#endif
}

// One token (a decode step's, the hybrid decode's CPU experts): each row's sum kept in a
// register, and a unit's codes read once for both halves of X. The same steps as IntRows.
template <int kBits>
void IntRowsOne(const IntInput& in, const QuantMat& W, float* y, size_t r0, size_t r1) {
  const int units = W.cols / W.group, G = W.group;
  HWY_ALIGN int16_t q[128];
  const size_t row_bytes = W.row_bytes();
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* row = W.q + r * row_bytes;
    float acc = 0.f;
    for (int u = 0; u < units; ++u) {
      WidenUnit<kBits>(row + size_t(u) * size_t(G) * kBits / 8, G, q);
      const size_t g = r * size_t(units) + size_t(u), at = size_t(u) * size_t(G);
      int32_t lo, hi;
      DotUnitPair(q, in.lo.data() + at, in.hi.data() + at, G, &lo, &hi);
      const int64_t D = int64_t(lo) + 32768 * int64_t(hi);
      acc = std::fma(float(D), W.scale(g) * in.split.pow2[size_t(u)], acc);
      acc = std::fma(W.bias(g), in.split.xsum[size_t(u)], acc);
    }
    y[r] = acc;
  }
}

template <int kBits>
void IntRows(const IntInput& in, int T, const QuantMat& W, float* y, size_t r0, size_t r1) {
  if (T == 1) return IntRowsOne<kBits>(in, W, y, r0, r1);
  const int units = W.cols / W.group, G = W.group;
  HWY_ALIGN int16_t q[128];
  const size_t row_bytes = W.row_bytes();
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* row = W.q + r * row_bytes;
    for (int t = 0; t < T; ++t) y[size_t(t) * size_t(W.rows) + r] = 0.f;
    for (int u = 0; u < units; ++u) {
      WidenUnit<kBits>(row + size_t(u) * size_t(G) * kBits / 8, G, q);
      const size_t g = r * size_t(units) + size_t(u);
      const float s = W.scale(g), b = W.bias(g);
      for (int t = 0; t < T; ++t) {
        const size_t at = size_t(t) * size_t(W.cols) + size_t(u) * size_t(G), k = size_t(t) * size_t(units) + size_t(u);
        const int64_t D = int64_t(DotUnit(q, in.lo.data() + at, G)) + 32768 * int64_t(DotUnit(q, in.hi.data() + at, G));
        float& acc = y[size_t(t) * size_t(W.rows) + r];
        acc = std::fma(float(D), s * in.split.pow2[k], acc);
        acc = std::fma(b, in.split.xsum[k], acc);
      }
    }
  }
}

// Each ys[i] = x · Ws[i]ᵀ, the Ws of one width and layout: x prepared once, and all their rows
// shared out over the threads in one pass.
void IntMatmulEachImpl(const float* x, int T, const QuantMat* Ws, float* const* ys, size_t n) {
  thread_local IntInput in;
  PrepareInput(x, T, Ws[0], in);
  const IntInput* input = &in;  // the caller's: inside the lambda `in` is the worker's own
  const size_t rows = size_t(Ws[0].rows), grain = std::max<size_t>(1, size_t(1 << 15) / size_t(Ws[0].cols));
  auto run = Ws[0].bits == 8 ? &IntRows<8> : &IntRows<4>;
  // Row r of the whole is row r % rows of matrix r / rows (the Ws have rows rows each).
  ThreadPool::global().parallel_for(
      n * rows,
      [&](size_t r0, size_t r1) {
        while (r0 < r1) {
          const size_t m = r0 / rows, end = std::min(r1, (m + 1) * rows);
          run(*input, T, Ws[m], ys[m], r0 - m * rows, end - m * rows);
          r0 = end;
        }
      },
      grain);
}

const char* IntMatmulTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace ms::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ms::cpu {

HWY_EXPORT(IntMatmulEachImpl);
HWY_EXPORT(IntMatmulTarget);

namespace {

void require_supported(const QuantMat& W) {
  if (!int_matmul_supported(W))
    fail("cpu::int_matmul: {}-bit group {} {} weights have no integer kernel (4 or 8 bits, groups of 32 to 128, "
         "bf16 or f16 scales)",
         W.bits, W.group, scale_type_name(W.scale_type));
}

}  // namespace

void int_matmul(const float* x, int T, const QuantMat& W, float* y) {
  require_supported(W);
  if (T <= 0 || W.rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(IntMatmulEachImpl)(x, T, &W, &y, 1);
}

void int_matmul_each(const float* x, int T, std::span<const QuantMat> Ws, std::span<float* const> ys) {
  if (Ws.size() != ys.size()) fail("cpu::int_matmul_each: {} matrices but {} outputs", Ws.size(), ys.size());
  if (Ws.empty()) return;
  for (const QuantMat& W : Ws) {
    require_supported(W);
    const QuantMat& A = Ws.front();
    if (W.rows != A.rows || W.cols != A.cols || W.bits != A.bits || W.group != A.group || W.scale_type != A.scale_type)
      fail("cpu::int_matmul_each: matrices of two layouts ({}-bit group {} [{}, {}] and {}-bit group {} [{}, {}])",
           A.bits, A.group, A.rows, A.cols, W.bits, W.group, W.rows, W.cols);
  }
  if (T <= 0 || Ws.front().rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(IntMatmulEachImpl)(x, T, Ws.data(), ys.data(), Ws.size());
}

const char* int_matmul_target() { return HWY_DYNAMIC_DISPATCH(IntMatmulTarget)(); }

}  // namespace ms::cpu
#endif  // HWY_ONCE
