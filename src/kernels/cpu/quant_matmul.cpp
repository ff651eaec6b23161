// Quantized matmul. Per group of a row, Σ_c x_c·(s·q_c + b) = s·Σ_c x_c·q_c + b·Σ_c x_c, so the
// decode matvec needs one FMA per weight on the raw integers and Σ x per group once per token.
// For T > 1 a block of rows is unpacked once into a small tile that all tokens then read.
//
// Unpacking: a u32 lane takes one byte (2/4/8 bits: 8/bits values) or one 3-byte unit (3 bits:
// 8 values); shifting the lanes by bits·j gives a vector whose lane l is value l·vpl + j. Rather
// than shuffle the weights back into order, x is permuted once per call into that order.
#include "kernels/cpu/quant_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "util/error.h"
#include "util/half.h"
#include "util/thread_pool.h"

// AVX-512, AVX2 and the portable fallback (HWY_SCALAR with GCC < 12.3, else EMU128); the SSE
// targets would only add build time.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/quant_matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace ms::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_SCALAR
constexpr bool kScalar = true;
#else
constexpr bool kScalar = false;
#endif

// Values a u32 lane holds: a byte's for 2/4/8 bits, a 3-byte unit's for 3 bits (8) and 6 bits
// (4), 20 bits' for 5 (4; odd lanes start mid-byte). The scalar target, whose one lane would
// start mid-byte every other step, takes 5 bits eight at a time from 5 bytes instead.
constexpr int ValuesPerLane(int bits) {
  if (bits == 3 || (bits == 5 && kScalar)) return 8;
  if (bits == 5 || bits == 6) return 4;
  return 8 / bits;
}

// Bytes of codes one decode step of n lanes consumes.
constexpr size_t StepBytes(int bits, size_t n) { return n * size_t(ValuesPerLane(bits)) * size_t(bits) / 8; }

// Bytes a step may read past its codes (the last row of a matrix is copied with this padding).
constexpr size_t kOverread = 8;

// Vectors no wider than one group's worth of lanes, so a decode step never spans two groups.
template <int kBits, int kGroup>
using GroupTag = hn::CappedTag<float, kGroup / ValuesPerLane(kBits)>;

// Lane l = the three bytes holding its values (3 and 6 bits: bytes 3l..3l+2; 5 bits: bytes
// ⌊5l/2⌋.., odd lanes shifted right by a nibble). Each 128-bit block reads 16 bytes for its
// 12 (10), so the last block reads up to 6 bytes past the units it decodes.
template <int kBits, class DU>
HWY_INLINE hn::Vec<DU> LoadUnits(DU du, const uint8_t* HWY_RESTRICT p) {
#if HWY_TARGET == HWY_SCALAR  // one lane, and no byte shuffles
  static_assert(kBits != 5, "5-bit codes take their own scalar path");
  return hn::Set(du, uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16);
#else
  if constexpr (hn::MaxLanes(du) > 4) {
    const hn::Half<DU> dh;
    return hn::Combine(du, LoadUnits<kBits>(dh, p + StepBytes(kBits, hn::Lanes(dh))), LoadUnits<kBits>(dh, p));
  } else {
    const hn::Repartition<uint8_t, DU> d8;
    constexpr uint8_t Z = 0x80;  // TableLookupBytesOr0 writes 0 for this index
    alignas(16) static constexpr uint8_t kUnits3[16] = {0, 1, 2, Z, 3, 4, 5, Z, 6, 7, 8, Z, 9, 10, 11, Z};
    alignas(16) static constexpr uint8_t kUnits5[16] = {0, 1, 2, Z, 2, 3, 4, Z, 5, 6, 7, Z, 7, 8, 9, Z};
    const auto units = hn::BitCast(du, hn::TableLookupBytesOr0(hn::LoadU(d8, p), hn::Load(d8, kBits == 5 ? kUnits5 : kUnits3)));
    if constexpr (kBits != 5) return units;
    return hn::Shr(units, hn::And(hn::ShiftLeft<2>(hn::Iota(du, 0)), hn::Set(du, 4u)));  // 0, 4, 0, 4
  }
#endif
}

template <int kBits, class DU>
HWY_INLINE hn::Vec<DU> LoadLanes(DU du, const uint8_t* HWY_RESTRICT p) {
  if constexpr (kBits == 3 || kBits == 5 || kBits == 6) {
    return LoadUnits<kBits>(du, p);
  } else {
    return hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint8_t, DU>(), p));
  }
}

// fn(integral_constant<size_t, I>) for I < kCount, unrolled: the indices are compile-time.
template <size_t kCount, class Fn>
HWY_INLINE void Unrolled(Fn&& fn) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (fn(std::integral_constant<size_t, I>()), ...);
  }(std::make_index_sequence<kCount>());
}

// Codes are decoded centred, q − kMidCode, and the bias moved to the group's middle,
// bias + scale·kMidCode (exact for bf16 and f16 scales, one rounding for f32 ones):
// s·Σx(q − m) + (b + s·m)·Σx is the same sum as s·Σxq + b·Σx, but its two terms no longer
// cancel, which cost up to ten times the float error of a plain dot product.
template <int kBits>
constexpr int32_t kMidCode = 1 << (kBits - 1);

template <int kBits>
HWY_INLINE float CentredBias(float scale, float bias) {
  return std::fma(scale, float(kMidCode<kBits>), bias);
}

// The vector form of DecodeStep: lane l's values from its unit of LoadLanes.
template <int kBits, class DF, class Emit>
HWY_INLINE void DecodeLanes(DF df, const uint8_t* HWY_RESTRICT p, Emit&& emit) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto lanes = LoadLanes<kBits>(du, p);
  const auto mask = hn::Set(du, (1u << kBits) - 1);
  const auto mid = hn::Set(di, kMidCode<kBits>);
  constexpr size_t kVpl = ValuesPerLane(kBits);
  Unrolled<kVpl>([&](auto j) {
    const auto v = hn::ShiftRight<kBits * decltype(j)::value>(lanes);
    // The top value of a lane needs no mask where nothing lies above it (not so for 5 bits).
    const auto q = decltype(j)::value + 1 == kVpl && kBits != 5 ? v : hn::And(v, mask);
    emit(j, hn::ConvertTo(df, hn::Sub(hn::BitCast(di, q), mid)));
  });
}

// One decode step: Lanes(df)·vpl values from StepBytes(bits, Lanes(df)) bytes at p. Calls
// emit(j, values) for j < vpl (j an integral_constant), lane l of `values` holding value
// l·vpl + j of the step.
template <int kBits, class DF, class Emit>
HWY_INLINE void DecodeStep(DF df, const uint8_t* HWY_RESTRICT p, Emit&& emit) {
  if constexpr (kScalar && kBits == 5) {  // eight values from five bytes
    uint64_t w = 0;
    std::memcpy(&w, p, 5);
    Unrolled<8>([&](auto j) {
      emit(j, hn::Set(df, float(int32_t((w >> (5 * decltype(j)::value)) & 31u) - kMidCode<kBits>)));
    });
  } else {
    DecodeLanes<kBits>(df, p, emit);
  }
}

// xp[t] = x[t] in decode order; gsum[t, g] = Σ x[t] over group g (unchanged by the permutation,
// which stays inside a step and hence inside a group).
template <int kBits, int kGroup>
void PermuteTokens(const float* x, int T, int cols, float* xp, float* gsum) {
  const GroupTag<kBits, kGroup> df;
  const size_t N = hn::Lanes(df), vpl = ValuesPerLane(kBits), step = N * vpl;
  for (int t = 0; t < T; ++t) {
    const float* xt = x + size_t(t) * size_t(cols);
    float* pt = xp + size_t(t) * size_t(cols);
    for (size_t base = 0; base < size_t(cols); base += step)
      for (size_t l = 0; l < N; ++l)
        for (size_t j = 0; j < vpl; ++j) pt[base + j * N + l] = xt[base + l * vpl + j];
    for (int g = 0; g < cols / kGroup; ++g) {
      double s = 0;
      for (int i = 0; i < kGroup; ++i) s += xt[g * kGroup + i];
      gsum[size_t(t) * size_t(cols / kGroup) + size_t(g)] = float(s);
    }
  }
}

struct RowRef {
  const uint8_t* q;
  const uint16_t* scales;
  const uint16_t* biases;
  ScaleType scale_type;

  float scale(int g) const { return scale_value(scales, size_t(g), scale_type); }
  float bias(int g) const { return scale_value(biases, size_t(g), scale_type); }
};

// TokenRowDots and TileDots round identically, so y[t, r] is the same bits whatever T is and
// whichever rows share a block: the MoE may regroup tokens without changing the answer.
// Per group: one FMA chain over the group's vectors in decode order (consecutive groups are
// independent, so out-of-order execution overlaps them), then total += scale·chain; the biases'
// part, Σ_g bias_g·Σx_g, is one vector pass over the row's groups at the end (BiasDot).

// Σ_g (bias_g + scale_g·kMidCode)·gsum_g over a row's groups. A scalar FMA per group inside the
// group loop cost as much as the codes' own FMAs at group 32 (GGUF's blocks); this runs 16
// groups an instruction. bf16 or f32 scales (f16 rows were widened to f32 by RowsTyped).
template <int kBits>
HWY_INLINE float BiasDot(const RowRef& row, const float* HWY_RESTRICT gsum, int groups) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> d16;
  const size_t N = hn::Lanes(df);
  const auto mid = hn::Set(df, float(kMidCode<kBits>));
  auto load = [&](const uint16_t* p, size_t g) {
    if (row.scale_type == ScaleType::F32) return hn::LoadU(df, reinterpret_cast<const float*>(p) + g);
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p + g))));
  };
  size_t g = 0;
  float sum = 0;
  if (size_t(groups) >= N) {  // rows of few groups (a small model's) skip the reduction
    auto acc = hn::Zero(df);
    for (; g + N <= size_t(groups); g += N)
      acc = hn::MulAdd(hn::MulAdd(load(row.scales, g), mid, load(row.biases, g)), hn::LoadU(df, gsum + g), acc);
    sum = hn::GetLane(hn::SumOfLanes(df, acc));
  }
  for (; g < size_t(groups); ++g) sum = std::fma(CentredBias<kBits>(row.scale(int(g)), row.bias(int(g))), gsum[g], sum);
  return sum;
}

// Σ_c xp[t, c]·deq(row)[c] for kT tokens at once straight from the packed row (kT = 1: the decode
// matvec): each decoded vector feeds kT FMAs, with no float tile written and read back. For the
// few tokens an expert gets in a prompt, where unpacking would dominate.
template <int kBits, int kGroup, int kT>
void TokenRowDots(RowRef row, int groups, const float* HWY_RESTRICT xp, size_t cols, const float* HWY_RESTRICT gsum,
                  float* HWY_RESTRICT y, size_t rows) {
  const GroupTag<kBits, kGroup> df;
  const size_t N = hn::Lanes(df), step = N * ValuesPerLane(kBits);
  const uint8_t* q = row.q;
  hn::Vec<decltype(df)> total[kT];
  for (int t = 0; t < kT; ++t) total[t] = hn::Zero(df);
  size_t c = 0;
  for (int g = 0; g < groups; ++g) {
    hn::Vec<decltype(df)> acc[kT];
    for (int t = 0; t < kT; ++t) acc[t] = hn::Zero(df);
    for (size_t i = 0; i < size_t(kGroup); i += step) {
      DecodeStep<kBits>(df, q, [&](size_t j, auto qf) {
        for (int t = 0; t < kT; ++t) acc[t] = hn::MulAdd(qf, hn::LoadU(df, xp + size_t(t) * cols + c + j * N), acc[t]);
      });
      q += StepBytes(kBits, N);
      c += step;
    }
    const auto scale = hn::Set(df, row.scale(g));
    for (int t = 0; t < kT; ++t) total[t] = hn::MulAdd(scale, acc[t], total[t]);
  }
  for (int t = 0; t < kT; ++t)
    y[size_t(t) * rows] =
        hn::GetLane(hn::SumOfLanes(df, total[t])) + BiasDot<kBits>(row, gsum + size_t(t) * size_t(groups), groups);
}

// Forwards of at most this many tokens decode each row once per block of four tokens rather than
// unpack it into a float tile (docs/PERFORMANCE.md#cpu-decode-with-every-weight-in-ram-issue-38).
constexpr int kFusedTokens = 8;

// tile[c] = q[c] as float, in decode order.
template <int kBits, int kGroup>
void UnpackRow(RowRef row, int cols, float* HWY_RESTRICT tile) {
  const GroupTag<kBits, kGroup> df;
  const size_t N = hn::Lanes(df), step = N * ValuesPerLane(kBits);
  const uint8_t* q = row.q;
  for (size_t i = 0; i < size_t(cols); i += step) {
    DecodeStep<kBits>(df, q, [&](size_t j, auto qf) { hn::StoreU(qf, df, tile + j * N); });
    q += StepBytes(kBits, N);
    tile += step;
  }
}

// Rows unpacked together for T > 1: x (T·cols floats, often beyond L1) is streamed once per
// block instead of once per row, which is what limits this path. On AVX-512 4 rows beat 2 even
// though 4 × 4 × 2 accumulators spill some registers (docs/PERFORMANCE.md#cpu-matmul).
constexpr size_t kRowBlock = HWY_TARGET <= HWY_AVX3 ? 4 : 2;

// Groups [g0, g1) of y[t·rows + r] = TokenRowDots(row r, xp[t]) for kT tokens and kR rows from
// unpacked tiles: each load feeds kT or kR FMAs. The vector totals ([kT·kR][lanes]) start at zero
// where g0 = 0, else come from `sums`; they go back to `sums`, or, at the last group, to y. Groups
// in order either way: the same bits as one pass.
template <int kBits, int kT, int kR, int kGroup, class DF>
void TileDots(DF df, const float* HWY_RESTRICT tile, const RowRef* row, int cols, const float* HWY_RESTRICT xp,
              const float* HWY_RESTRICT gsum, float* y, size_t rows, int g0, int g1, float* sums) {
  const size_t N = hn::Lanes(df);
  const int groups = cols / kGroup;
  hn::Vec<DF> total[kT][kR];
  for (int t = 0; t < kT; ++t)
    for (int r = 0; r < kR; ++r) total[t][r] = g0 == 0 ? hn::Zero(df) : hn::LoadU(df, sums + size_t(t * kR + r) * N);
  for (int g = g0; g < g1; ++g) {
    hn::Vec<DF> acc[kT][kR];
    for (auto& per_token : acc)
      for (auto& a : per_token) a = hn::Zero(df);
    for (size_t c = size_t(g) * kGroup; c < size_t(g + 1) * kGroup; c += N) {
      hn::Vec<DF> w[kR];
      for (int r = 0; r < kR; ++r) w[r] = hn::LoadU(df, tile + size_t(r) * size_t(cols) + c);
      for (int t = 0; t < kT; ++t) {
        const auto xv = hn::LoadU(df, xp + size_t(t) * size_t(cols) + c);
        for (int r = 0; r < kR; ++r) acc[t][r] = hn::MulAdd(w[r], xv, acc[t][r]);
      }
    }
    for (int r = 0; r < kR; ++r) {
      const auto scale = hn::Set(df, row[r].scale(g));
      for (int t = 0; t < kT; ++t) total[t][r] = hn::MulAdd(scale, acc[t][r], total[t][r]);
    }
  }
  for (int t = 0; t < kT; ++t)
    for (int r = 0; r < kR; ++r) {
      if (g1 == groups) {
        y[size_t(t) * rows + size_t(r)] = hn::GetLane(hn::SumOfLanes(df, total[t][r])) +
                                          BiasDot<kBits>(row[r], gsum + size_t(t) * size_t(groups), groups);
      } else {
        hn::StoreU(total[t][r], df, sums + size_t(t * kR + r) * N);
      }
    }
}

// Columns a TileDots pass covers: a block of kR tile rows and one token block's x (4 tokens) stay
// in L1 (48 KiB here) while every token block passes over them; whole rows (8 KiB each for a
// 2048-wide matrix) did not fit beside x and went to L2 on every pass.
constexpr int kTileCols = 1024;

// All T tokens against kR unpacked rows, a column block at a time, four tokens at a time within.
template <int kBits, int kR, int kGroup, class DF>
void TokenBlocks(DF df, const float* tile, const RowRef* row, int cols, const float* xp, const float* gsum, int T,
                 float* y, size_t rows) {
  const int groups = cols / kGroup, block = std::max(1, kTileCols / kGroup);
  thread_local std::vector<float> totals;
  totals.resize(size_t(T) * kR * hn::Lanes(df));
  for (int g0 = 0; g0 < groups; g0 += block) {
    const int g1 = std::min(groups, g0 + block);
    for (int t = 0; t < T; t += 4) {
      const float* xt = xp + size_t(t) * size_t(cols);
      const float* st = gsum + size_t(t) * size_t(groups);
      float* yt = y + size_t(t) * rows;
      float* sums = totals.data() + size_t(t) * kR * hn::Lanes(df);
      switch (std::min(4, T - t)) {
        case 4: TileDots<kBits, 4, kR, kGroup>(df, tile, row, cols, xt, st, yt, rows, g0, g1, sums); break;
        case 3: TileDots<kBits, 3, kR, kGroup>(df, tile, row, cols, xt, st, yt, rows, g0, g1, sums); break;
        case 2: TileDots<kBits, 2, kR, kGroup>(df, tile, row, cols, xt, st, yt, rows, g0, g1, sums); break;
        default: TileDots<kBits, 1, kR, kGroup>(df, tile, row, cols, xt, st, yt, rows, g0, g1, sums); break;
      }
    }
  }
}

// x permuted into a weight layout's decode order, and its sums per group (PermuteTokens).
struct PermutedInput {
  std::vector<float> xp, gsum;
};

template <int kBits, int kGroup>
void PermuteTyped(const float* x, int T, int cols, PermutedInput& in) {
  in.xp.resize(size_t(T) * size_t(cols));
  in.gsum.resize(size_t(T) * size_t(cols / kGroup));
  PermuteTokens<kBits, kGroup>(x, T, cols, in.xp.data(), in.gsum.data());
}

// f16 scales or biases as float32, n of them: a row's are widened at once (vcvtph2ps where the
// target has it), because converting each in the group loops halved the matvec's speed.
HWY_INLINE void WidenF16(const uint16_t* HWY_RESTRICT src, size_t n, float* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src + i))), df, dst + i);
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// y rows [r0, r1) of one matmul, x permuted: the work of one thread's chunk.
template <int kBits, int kGroup>
void RowsTyped(const PermutedInput& in, int T, const QuantMat& W, float* y, size_t r0, size_t r1) {
  const int cols = W.cols, groups = W.groups_per_row();
  const size_t rows = size_t(W.rows), row_bytes = W.row_bytes();
  const float* xs = in.xp.data();
  const float* sums = in.gsum.data();
  thread_local std::vector<uint8_t> padded;
  thread_local std::vector<float> widened;  // [kRowBlock][scales, biases] of f16 rows, as float
  if (W.scale_type == ScaleType::F16) widened.resize(kRowBlock * 2 * size_t(groups));
  // Row r's codes and scales; f16 scales are widened into slot `slot` of `widened`.
  auto row_at = [&](size_t r, size_t slot = 0) {
    const size_t first = r * size_t(groups);
    RowRef row{W.q + r * row_bytes, scale_entry(W.scales, first, W.scale_type), scale_entry(W.biases, first, W.scale_type),
               W.scale_type};
    if (W.scale_type == ScaleType::F16) {
      float* to = widened.data() + slot * 2 * size_t(groups);
      WidenF16(row.scales, size_t(groups), to);
      WidenF16(row.biases, size_t(groups), to + groups);
      row = {row.q, reinterpret_cast<const uint16_t*>(to), reinterpret_cast<const uint16_t*>(to + groups), ScaleType::F32};
    }
    if ((kBits == 3 || kBits == 5 || kBits == 6) && r + 1 == rows) {  // LoadUnits reads past the row
      padded.assign(row.q, row.q + row_bytes);
      padded.resize(row_bytes + kOverread);
      row.q = padded.data();
    }
    return row;
  };
  if (T <= kFusedTokens) {
    // Token blocks outside, rows inside: a block's x (four tokens) stays in L1 while rows stream.
    for (int t = 0; t < T; t += 4) {
      const float* xt = xs + size_t(t) * size_t(cols);
      const float* st = sums + size_t(t) * size_t(groups);
      float* yt = y + size_t(t) * rows;
      const int kt = std::min(4, T - t);
      for (size_t r = r0; r < r1; ++r) {
        const RowRef row = row_at(r);
        switch (kt) {
          case 4: TokenRowDots<kBits, kGroup, 4>(row, groups, xt, size_t(cols), st, yt + r, rows); break;
          case 3: TokenRowDots<kBits, kGroup, 3>(row, groups, xt, size_t(cols), st, yt + r, rows); break;
          case 2: TokenRowDots<kBits, kGroup, 2>(row, groups, xt, size_t(cols), st, yt + r, rows); break;
          default: TokenRowDots<kBits, kGroup, 1>(row, groups, xt, size_t(cols), st, yt + r, rows); break;
        }
      }
    }
    return;
  }
  const GroupTag<kBits, kGroup> df;
  thread_local std::vector<float> tile;
  tile.resize(kRowBlock * size_t(cols));
  for (size_t r = r0; r < r1;) {
    const size_t nr = r1 - r >= kRowBlock ? kRowBlock : 1;
    RowRef block[kRowBlock];
    for (size_t i = 0; i < nr; ++i) {
      block[i] = row_at(r + i, i);
      UnpackRow<kBits, kGroup>(block[i], cols, tile.data() + i * size_t(cols));
    }
    if (nr == kRowBlock) {
      TokenBlocks<kBits, kRowBlock, kGroup>(df, tile.data(), block, cols, xs, sums, T, y + r, rows);
    } else {
      TokenBlocks<kBits, 1, kGroup>(df, tile.data(), block, cols, xs, sums, T, y + r, rows);
    }
    r += nr;
  }
}

using PermuteFn = void (*)(const float*, int, int, PermutedInput&);
using RowsFn = void (*)(const PermutedInput&, int, const QuantMat&, float*, size_t, size_t);

template <int kBits>
std::pair<PermuteFn, RowsFn> KernelsOfGroup(int group) {
  switch (group) {
    case 16:
      if constexpr (kBits >= 4) return {&PermuteTyped<kBits, 16>, &RowsTyped<kBits, 16>};
      [[fallthrough]];
    case 32: return {&PermuteTyped<kBits, 32>, &RowsTyped<kBits, 32>};
    case 64: return {&PermuteTyped<kBits, 64>, &RowsTyped<kBits, 64>};
    default: return {&PermuteTyped<kBits, 128>, &RowsTyped<kBits, 128>};
  }
}

std::pair<PermuteFn, RowsFn> KernelsOf(const QuantMat& W) {
  switch (W.bits) {
    case 2: return KernelsOfGroup<2>(W.group);
    case 3: return KernelsOfGroup<3>(W.group);
    case 4: return KernelsOfGroup<4>(W.group);
    case 5: return KernelsOfGroup<5>(W.group);
    case 6: return KernelsOfGroup<6>(W.group);
    default: return KernelsOfGroup<8>(W.group);
  }
}

// Enough weights per chunk that scheduling stays negligible next to the row work.
size_t RowGrain(const QuantMat& W) { return std::max<size_t>(1, size_t(1 << 15) / size_t(W.cols)); }

void MatmulQuantImpl(const float* x, int T, const QuantMat& W, float* y) {
  const auto [permute, rows_of] = KernelsOf(W);
  thread_local PermutedInput in;
  permute(x, T, W.cols, in);
  const PermutedInput* input = &in;  // the caller's: inside the lambda `in` is the worker's own
  ThreadPool::global().parallel_for(
      size_t(W.rows), [&](size_t r0, size_t r1) { rows_of(*input, T, W, y, r0, r1); }, RowGrain(W));
}

// Every job's rows split over one parallel region, in chunks of RowGrain rows that never span two
// jobs; jobs that read the same x with the same layout share its permutation.
void MatmulQuantBatchImpl(const QuantJob* jobs, size_t n) {
  struct Prepared {
    RowsFn rows_of;
    const PermutedInput* in;
    size_t first_chunk, grain;
  };
  thread_local std::vector<std::unique_ptr<PermutedInput>> inputs;
  std::vector<Prepared> prep(n);
  size_t chunks = 0, used = 0;
  for (size_t j = 0; j < n; ++j) {
    const QuantJob& job = jobs[j];
    const auto [permute, rows_of] = KernelsOf(job.W);
    const PermutedInput* in = nullptr;
    for (size_t k = 0; k < j && !in; ++k)
      if (jobs[k].x == job.x && jobs[k].T == job.T && jobs[k].W.cols == job.W.cols && jobs[k].W.bits == job.W.bits &&
          jobs[k].W.group == job.W.group)  // the permutation depends on bits and group, not on the scales' type
        in = prep[k].in;
    if (!in) {
      if (used == inputs.size()) inputs.push_back(std::make_unique<PermutedInput>());
      permute(job.x, job.T, job.W.cols, *inputs[used]);
      in = inputs[used++].get();
    }
    const size_t grain = RowGrain(job.W);
    prep[j] = {rows_of, in, chunks, grain};
    chunks += (size_t(job.W.rows) + grain - 1) / grain;
  }
  ThreadPool::global().parallel_for(chunks, [&](size_t c0, size_t c1) {
    for (size_t c = c0; c < c1; ++c) {
      // The job whose chunks hold c: the last one starting at or before it.
      size_t j = size_t(std::upper_bound(prep.begin(), prep.end(), c,
                                         [](size_t v, const Prepared& p) { return v < p.first_chunk; }) -
                        prep.begin()) - 1;
      const Prepared& p = prep[j];
      const QuantJob& job = jobs[j];
      const size_t r0 = (c - p.first_chunk) * p.grain, r1 = std::min(size_t(job.W.rows), r0 + p.grain);
      p.rows_of(*p.in, job.T, job.W, job.y, r0, r1);
    }
  });
}

const char* MatmulQuantTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace ms::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ms::cpu {

HWY_EXPORT(MatmulQuantImpl);
HWY_EXPORT(MatmulQuantBatchImpl);
HWY_EXPORT(MatmulQuantTarget);

void matmul_quant(const float* x, int T, const QuantMat& W, float* y) {
  check_quant_shape(W.rows, W.cols, W.bits, W.group, "matmul_quant: weight matrix");
  if (T < 1) fail("matmul_quant: token count must be ≥ 1, got {}", T);
  if (W.rows == 0) return;
  HWY_DYNAMIC_DISPATCH(MatmulQuantImpl)(x, T, W, y);
}

void matmul_quant_batch(const QuantJob* jobs, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    check_quant_shape(jobs[j].W.rows, jobs[j].W.cols, jobs[j].W.bits, jobs[j].W.group, "matmul_quant_batch: weight matrix");
    if (jobs[j].T < 1) fail("matmul_quant_batch: token count must be ≥ 1, got {}", jobs[j].T);
  }
  if (n > 0) HWY_DYNAMIC_DISPATCH(MatmulQuantBatchImpl)(jobs, n);
}

const char* matmul_quant_target() { return HWY_DYNAMIC_DISPATCH(MatmulQuantTarget)(); }

}  // namespace ms::cpu
#endif  // HWY_ONCE
