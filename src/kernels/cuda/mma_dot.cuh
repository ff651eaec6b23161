#pragma once
// Dot products of affine 2/3/4/8-bit rows (bf16 or f16 scales, groups of 32 or more) on the
// integer tensor cores, for the decode matvec (matmul.cu) and the routed experts (moe.cu).
// Decoding a code to float and one FMA per weight issues more instructions per byte than HBM
// delivers at 4 bits and below. Here the codes go to the tensor cores as unsigned bytes, which
// costs a shift and a mask per four of them (nothing at 8 bits), and x as integers: each unit of
// 32 or 64 values (what a lane reads of a row at once) is scaled by a power of two to 30-bit
// integers X (exact for every value within 2^30 of the unit's largest; the rest lose at most
// 2^-31 of that largest) and split into four signed bytes. The MMA sums codes × bytes exactly in
// int32, and the four sums meet again in float with their powers of 256.
//
// The layout (mma.m16n8k32, A = 16 rows × 32 k of codes, B = 32 k × 8 columns of x's bytes): lane
// (g, t) = (lane / 4, lane % 4) of a warp decodes its chunk of quad q (32 codes; chunk_of: 4q + t
// when lanes read one chunk at a time) of rows g and g + 8 of a 16-row tile; at each of 4 k-steps
// it puts 8 codes of each row in its A registers. One MMA's sum over k thus mixes four chunks (segments), which have their own
// quantization scales and powers of two: the B operand keeps them apart. Its column n holds byte
// n / 4 of segment n % 4 (lane t = n % 4's slots) and zeros elsewhere, in a first MMA for bytes
// 0 and 1 and a second for bytes 2 and 3, so that C[row][n] is the dot of one chunk with one byte.
// Which column of W a k slot stands for is free: a lane's slots hold the codes in the order its
// decoding produces them (code_of), and x is staged in that order (stage_split).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/weight_dot.cuh"

namespace ms::cuda {

inline constexpr int kMmaSteps = 4;    // k-steps of a chunk: 32 codes, 8 per lane and row
inline constexpr int kMmaParts = 4;    // signed bytes of X
inline constexpr int kQuadChunks = 4;  // chunks a quad spans: one per lane t

// The code (of the 32 of a chunk) in byte m of A register r (0: k slots 4t.., 1: 16 + 4t..) of
// step j, as decode_step makes them.
template <int BITS>
__host__ __device__ constexpr int code_of(int j, int r, int m) {
  if constexpr (BITS == 8) return 8 * j + 4 * r + m;                       // words 2j, 2j + 1
  if constexpr (BITS == 4) return 8 * j + 2 * m + r;                       // word j, nibbles 2m + r
  if constexpr (BITS == 2) return 16 * (j / 2) + 2 * (j % 2) + r + 4 * m;  // word j / 2, >> 2(2(j%2) + r)
  return 8 * m + 2 * j + r;  // 3 bits: code 2j + r of each 24-bit group m
}

// The A registers of step j (a compile-time constant once unrolled) of a chunk's words w: four
// codes as bytes in each.
template <int BITS>
__device__ __forceinline__ uint2 decode_step(const uint32_t (&w)[BITS], int j) {
  if constexpr (BITS == 8) {
    return make_uint2(w[2 * j], w[2 * j + 1]);
  } else if constexpr (BITS == 4) {
    return make_uint2(w[j] & 0x0F0F0F0Fu, (w[j] >> 4) & 0x0F0F0F0Fu);
  } else if constexpr (BITS == 2) {
    const uint32_t x = w[j / 2] >> (4 * (j % 2));
    return make_uint2(x & 0x03030303u, (x >> 2) & 0x03030303u);
  } else {
    static_assert(BITS == 3, "2, 3, 4 or 8 bits");
    // Byte m of ta, tb, tc: bits 0-7, 8-15, 16-23 of the chunk's 24-bit group m (bits 24m..).
    const uint32_t ta = __byte_perm(__byte_perm(w[0], w[1], 0x0630), w[2], 0x5210);
    const uint32_t tb = __byte_perm(__byte_perm(w[0], w[1], 0x0741), w[2], 0x6210);
    const uint32_t tc = __byte_perm(__byte_perm(w[0], w[1], 0x0052), w[2], 0x7410);
    auto code = [&](int k) -> uint32_t {  // code k of each group, at bits 3k of it
      switch (k) {
        case 0: return ta & 0x07070707u;
        case 1: return (ta >> 3) & 0x07070707u;
        case 2: return ((ta >> 6) & 0x03030303u) | ((tb << 2) & 0x04040404u);
        case 3: return (tb >> 1) & 0x07070707u;
        case 4: return (tb >> 4) & 0x07070707u;
        case 5: return ((tb >> 7) & 0x01010101u) | ((tc << 1) & 0x06060606u);
        case 6: return (tc >> 2) & 0x07070707u;
        default: return (tc >> 5) & 0x07070707u;
      }
    };
    return make_uint2(code(2 * j), code(2 * j + 1));
  }
}

// d += a · b, m16n8k32, unsigned byte codes times signed bytes, int32 accumulation (exact).
__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint2 a_row_g, uint2 a_row_g8, uint2 b) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a_row_g.x), "r"(a_row_g8.x), "r"(a_row_g.y), "r"(a_row_g8.y), "r"(b.x), "r"(b.y));
}

// Chunks a lane reads of a row at once, L: 32 to 48 bytes of codes (the L1 is what limits the
// kernel, and its work grows with the number of loads more than with their bytes). A unit, the
// G = min(L, chunks of a group) consecutive chunks of a lane that share a scale, a bias and a power
// of two of x, is summed exactly in int32 and then scaled once; where a lane's L chunks span L / G
// groups, it loads their (consecutive) scales in one load. Each L was chosen by bench_cuda_matvec
// on the H200 (docs/PERFORMANCE.md#cuda-matvec).
// Quad q is lane t's chunk (q / L)·4L + t·L + q % L: the L quads of a lane block are read together.
template <int BITS>
inline constexpr int kLaneChunks = BITS == 8 ? 1 : BITS == 4 ? 2 : 4;

// Calls f(L, G) (std::integral_constant) with the lane layout of rows of `cols` columns whose
// groups hold 2^chunks_per_group_log2 chunks. A lane loads the scales of L / G > 1 units (groups)
// at once only where `groups_fit` (every matrix loaded together has these groups, and its scales
// and biases are 8-byte aligned) and rows hold a multiple of L chunks, so that the units' scales
// are aligned to that many; other rows read one unit a lane block.
template <int BITS, int LMAX = kLaneChunks<BITS>, class F>
void with_lane_layout(int cols, int chunks_per_group_log2, bool groups_fit, F&& f) {
  using std::integral_constant;
  const int G = std::min(LMAX, 1 << chunks_per_group_log2);
  const bool wide = G == LMAX || (groups_fit && (cols / kChunk) % LMAX == 0);
  auto with_g = [&](auto L) {
    if (G == 1) return f(L, integral_constant<int, 1>{});
    if constexpr (decltype(L)::value >= 2) {
      if (G == 2) return f(L, integral_constant<int, 2>{});
    }
    if constexpr (decltype(L)::value >= 4) return f(L, integral_constant<int, 4>{});
  };
  if (wide) return with_g(integral_constant<int, LMAX>{});
  if (G == 1) return f(integral_constant<int, 1>{}, integral_constant<int, 1>{});
  if constexpr (LMAX >= 4) {
    if (G == 2) return f(integral_constant<int, 2>{}, integral_constant<int, 2>{});
  }
}

__host__ __device__ constexpr int chunk_of(int L, int q, int t) { return (q / L) * kQuadChunks * L + t * L + q % L; }

// Quads of a row of `cols` columns, a whole number of lane blocks.
__host__ __device__ inline int quads_of(int cols, int L) {
  const int per_block = kQuadChunks * L;
  return (cols / kChunk + per_block - 1) / per_block * L;
}

// Entries (uint2: one step's B registers of one lane t and byte p) per quad of TT tokens. A lane
// t's four entries of a step are in the byte order 0, 2, 1, 3, so that the two a lane reads
// (bytes p and p + 2, one for each of a step's MMAs) are adjacent.
__host__ __device__ constexpr int quad_entries(int TT) { return kMmaSteps * TT * kQuadChunks * kMmaParts; }

// Whether mma_accumulate reads a lane's two entries of a step as one 16-byte load, only the lanes
// that supply them loading (else each entry as an 8-byte load by every lane, the others from a
// quad of zeros past the last). Only at L <= 2: with L = 4 (2 and 3 bits) the kernels spilled and
// lost (docs/PERFORMANCE.md#cuda-matvec).
__host__ __device__ constexpr bool wide_b(int L) { return L <= 2; }

// Quads of zeros past the last that stage_split writes: one where lanes read them (!wide_b).
__host__ __device__ constexpr int zero_quads(int L) { return wide_b(L) ? 0 : 1; }

// Shared memory stage_split fills for TT tokens of `cols` columns: the B operands of each quad (and
// the zero quads), then the power of two and Σx of each unit (room for one a chunk).
__host__ __device__ inline size_t split_bytes(int TT, int cols, int L) {
  const int nquads = quads_of(cols, L);
  return size_t(nquads + zero_quads(L)) * quad_entries(TT) * sizeof(uint2) +
         2 * size_t(TT) * nquads * kQuadChunks * sizeof(float);
}

// What stage_split staged for `tokens` tokens, seen from token tt0: the kernels below read tokens
// tt0 .. tt0 + TT − 1 of it.
struct StagedX {
  const uint2* xb;
  const float* pow2;
  const float* xsum;
  int nquads, tokens, tt0;
};

// A kernel's dynamic shared memory carved as split_bytes counts it for `tokens` tokens of `cols`
// columns: where stage_split writes, and `rest`, the kernel's own space after it.
struct SplitSmem {
  uint2* xb;
  float *pow2, *xsum, *rest;
  int nquads;
};

template <int L>
__device__ __forceinline__ SplitSmem split_smem(uint2* smem, int tokens, int cols) {
  const int nquads = quads_of(cols, L);
  const size_t units = size_t(tokens) * nquads * kQuadChunks;  // room for one a chunk
  float* pow2 = reinterpret_cast<float*>(smem + size_t(nquads + zero_quads(L)) * quad_entries(tokens));
  return {smem, pow2, pow2 + units, pow2 + 2 * units, nquads};
}

// X (|X| < 2^30) as its balanced base-256 digits, X = Σ_p d_p·256^p with each d_p in [-128, 127],
// byte p of the result: with Y = X + 0x808080, d_p = byte p of Y − 128 (that byte xor 0x80 as a
// signed byte) for p < 3 and d_3 = byte 3 of Y.
__device__ __forceinline__ uint32_t digits(int X) { return (uint32_t(X) + 0x808080u) ^ 0x808080u; }

// out[p] = byte p of in[0], in[1], in[2], in[3] (in its bytes 0..3).
__device__ __forceinline__ void transpose_bytes(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140), hi01 = __byte_perm(in[0], in[1], 0x7362);
  const uint32_t lo23 = __byte_perm(in[2], in[3], 0x5140), hi23 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(lo01, lo23, 0x5410), out[1] = __byte_perm(lo01, lo23, 0x7632);
  out[2] = __byte_perm(hi01, hi23, 0x5410), out[3] = __byte_perm(hi01, hi23, 0x7632);
}

// 2^e as a float, e in [-149, 127].
__device__ __forceinline__ float pow2f(int e) {
  return e >= -126 ? __int_as_float((127 + e) << 23) : __int_as_float(1 << (e + 149));
}

// The 8 values of a chunk of x that step j of its MMAs puts in the B registers: a[r][m] is the
// value of code code_of<BITS>(j, r, m). At 8 and 4 bits they are values 8j .. 8j + 7, read as two
// 16-byte loads (faster than four 8-byte ones: docs/PERFORMANCE.md#cuda-matvec); at 2 and 3 bits
// r = 0 and 1 are adjacent.
template <int BITS>
__device__ __forceinline__ void load_step(const float* __restrict__ chunk, int j, float (&a)[2][4]) {
  if constexpr (BITS == 8) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(chunk + code_of<BITS>(j, r, 0)));
      a[r][0] = f.x, a[r][1] = f.y, a[r][2] = f.z, a[r][3] = f.w;
    }
  } else if constexpr (BITS == 4) {  // code 8j + 2m + r
    const float4* p = reinterpret_cast<const float4*>(chunk + code_of<BITS>(j, 0, 0));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 f = __ldg(p + h);
      a[0][2 * h] = f.x, a[1][2 * h] = f.y, a[0][2 * h + 1] = f.z, a[1][2 * h + 1] = f.w;
    }
  } else {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const float2 f = __ldg(reinterpret_cast<const float2*>(chunk + code_of<BITS>(j, 0, m)));
      a[0][m] = f.x, a[1][m] = f.y;
    }
  }
}

// Steps a thread of stage_split loads before it converts any: their loads are in flight together.
inline constexpr int kStageSteps = 2;

// Stages TT rows of x [TT, cols] (rows from `valid` on, and chunks past cols / 32, read as zero).
// The values of a unit (G consecutive chunks, which one lane reads) become X = x·2^-e,
// e = ilogb(max |x|) − 29 (no less than −149, so that 2^e is a float; 2^e is NaN for a unit
// holding a NaN or an infinity). xb [nquads][kMmaSteps][TT][kQuadChunks][kMmaParts] holds the
// B registers (byte p of the X of the codes code_of names: A register 0's in .x, 1's in .y; bytes
// in the order 0, 2, 1, 3, see quad_entries; then zero_quads(L) quads of zeros), pow2
// [TT][nquads·4/G] holds 2^e and xsum [TT][nquads·4/G] Σx (for the bias term b·Σx) by unit (rows
// nquads·4 apart). THREADS threads (whole warps) call it, `tid` from 0 in each; the caller
// syncs before the values are read (stage_split: the whole block, with the barrier).
// Staging sits on every matvec's critical path, between the wait for x and the first MMA, so a
// thread takes one step of a chunk (8 values; the 4G threads of a unit are adjacent lanes) rather
// than a whole chunk, and its stores are 16 bytes wide and spread over the banks
// (docs/PERFORMANCE.md#cuda-matvec).
template <int BITS, int L, int G, int THREADS>
__device__ __forceinline__ void stage_split_part(int tid, const float* __restrict__ x, int TT, int valid, int cols,
                                                 uint2* xb, float* pow2, float* xsum) {
  const int nchunks = cols / kChunk, nquads = quads_of(cols, L), padded = nquads * kQuadChunks;
  for (int i = tid; i < zero_quads(L) * quad_entries(TT); i += THREADS)
    xb[size_t(nquads) * quad_entries(TT) + i] = {0, 0};
  const int n = TT * padded * kMmaSteps;  // (token, chunk, step), step fastest
  for (int base = 0; base < n; base += kStageSteps * THREADS) {
    float a[kStageSteps][2][4] = {};
#pragma unroll
    for (int k = 0; k < kStageSteps; ++k) {
      const int i = base + k * THREADS + tid, t = i / kMmaSteps / padded, c = i / kMmaSteps % padded;
      if (i < n && t < valid && c < nchunks)
        load_step<BITS>(x + size_t(t) * cols + size_t(c) * kChunk, i % kMmaSteps, a[k]);
    }
#pragma unroll
    for (int k = 0; k < kStageSteps; ++k) {
      if (base + k * THREADS >= n) break;  // uniform: every lane reaches the shuffles
      const int i = base + k * THREADS + tid, j = i % kMmaSteps;
      const int t = i / kMmaSteps / padded, c = i / kMmaSteps % padded;
      float mx = 0.f, sum = 0.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(a[k][r][0]), fabsf(a[k][r][1])), fmaxf(fabsf(a[k][r][2]), fabsf(a[k][r][3]))));
        sum += (a[k][r][0] + a[k][r][1]) + (a[k][r][2] + a[k][r][3]);
      }
#pragma unroll
      for (int o = 1; o < kMmaSteps * G; o *= 2) {  // the unit's other steps are the neighbouring lanes'
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      }
      // An infinity makes the maximum infinite and a NaN the sum NaN (fmaxf drops NaNs), so the
      // values need no test of their own. That and the exponent and halves below replace per-value
      // tests and their shuffles, ilogbf and pow2f, on staging's critical path
      // (docs/PERFORMANCE.md#cuda-matvec).
      const bool finite = isfinite(mx) && isfinite(sum);
      if (i >= n) continue;
      // ilogb(mx) − 29 from the exponent bits: a subnormal mx (bits 0) gives −156, clamped as
      // ilogb's would be.
      const int e = mx > 0.f ? max(int(__float_as_uint(mx) >> 23) - 127 - 29, -149) : 0;
      if (j == 0 && c % G == 0) {
        pow2[t * padded + c / G] = finite ? pow2f(e) : __int_as_float(0x7fc00000);
        xsum[t * padded + c / G] = sum;
      }
      // X = x·2^-e by two exact power-of-two products (2^-e alone may not be a float; its halves,
      // −e/2 in [−50, 75], are normal). A unit that is not finite gets X = 0: x·0 is 0 or NaN, and
      // NaN converts to 0.
      const float s1 = finite ? __int_as_float((127 + -e / 2) << 23) : 0.f;
      const float s2 = __int_as_float((127 + -e - -e / 2) << 23);
      uint32_t b[2][kMmaParts];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        uint32_t d[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) d[m] = digits(__float2int_rn(a[k][r][m] * s1 * s2));
        transpose_bytes(d, b[r]);
      }
      // Chunk c is lane (c % 4L) / L's of quad (c / 4L)·L + c % L (chunk_of's inverse). The step's
      // four entries (bytes 0, 2 | 1, 3) go as two 16-byte halves, odd steps' second first: a
      // lane_t's entries fall in 8 of the 32 banks whatever the step, and this way the 8 lanes of
      // one lane_t in a store (L <= 2) split over both halves, 4 wavefronts a store, the fewest
      // for 512 bytes. (Eight-byte stores of one entry a lane took 8 where 2 would do.)
      const int q = c / (kQuadChunks * L) * L + c % L, lane_t = c % (kQuadChunks * L) / L;
      uint4* dst = reinterpret_cast<uint4*>(xb + size_t(q) * quad_entries(TT) +
                                            ((j * TT + t) * kQuadChunks + lane_t) * kMmaParts);
      const uint4 lo = make_uint4(b[0][0], b[1][0], b[0][2], b[1][2]);
      const uint4 hi = make_uint4(b[0][1], b[1][1], b[0][3], b[1][3]);
      const int odd = j & 1;
      dst[odd] = odd ? hi : lo;
      dst[odd ^ 1] = odd ? lo : hi;
    }
  }
}

// stage_split_part by every thread of a block of THREADS, then a barrier.
template <int BITS, int L, int G, int THREADS>
__device__ __forceinline__ void stage_split(const float* __restrict__ x, int TT, int valid, int cols, uint2* xb,
                                            float* pow2, float* xsum) {
  stage_split_part<BITS, L, G, THREADS>(int(threadIdx.x), x, TT, valid, cols, xb, pow2, xsum);
  __syncthreads();
}

// What a lane holds of a lane block of a tile's two rows g and g + 8: the codes of its L chunks,
// and the scale and bias of each of its L / G units, as the bf16 (or f16) pairs they load as
// (unit u in half u % 2 of word u / 2; registers are what the kernels have least of).
template <int BITS, int L, int G>
struct LaneBlock {
  static constexpr int kWords = (L / G + 1) / 2;
  uint32_t w[2][L][BITS];
  uint32_t scale[2][kWords], bias[2][kWords];
};

// Unit u's value of a LaneBlock's scale or bias words: bf16, or f16 where f16 is set.
template <int N>
__device__ __forceinline__ float unit_value(const uint32_t (&words)[N], int u, bool f16) {
  const uint32_t w = words[u / 2];
  if (f16) return __half2float(__ushort_as_half(uint16_t(u % 2 ? w >> 16 : w)));
  return __uint_as_float(u % 2 ? w & 0xffff0000u : w << 16);
}

// Where a lane reads the tile's two rows (clamped to the last row): its first chunk of quad 0,
// and the rows' first scale (and bias) index.
struct TileRows {
  const uint8_t* w[2];
  uint32_t s[2];
};

template <int BITS, int L>
__device__ __forceinline__ TileRows tile_rows(const WeightArgs& W, int r0, int g, int t) {
  const int ngroups = (W.cols / kChunk) >> W.chunks_per_group_log2;
  TileRows tr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = min(r0 + g + 8 * h, W.rows - 1);
    tr.w[h] = W.data + size_t(row) * (size_t(W.cols) * BITS / 8) + t * L * (kChunk * BITS / 8);
    tr.s[h] = uint32_t(row) * uint32_t(ngroups);
  }
  return tr;
}

// Loads of weight codes, which a block reads once: they are the first out of the L1, whose lines
// then serve x and the scales (read by several lanes and blocks) instead: faster than __ldg for
// the large matrices (docs/PERFORMANCE.md#cuda-matvec).
__device__ __forceinline__ uint4 load_codes(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint2 load_codes(const uint2* p) {
  uint2 v;
  asm("ld.global.nc.L1::evict_first.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t load_codes(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::evict_first.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// N consecutive words of codes from p, in the widest loads its alignment (N·4 bytes) allows.
template <int N>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t* w) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 v = load_codes(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const uint2 v = load_codes(reinterpret_cast<const uint2*>(p) + i);
      w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = load_codes(reinterpret_cast<const uint32_t*>(p) + i);
  }
}

// N consecutive bf16 values from p (aligned to N of them), in one load, as words of two.
template <int N>
__device__ __forceinline__ void load_bf16s(const uint16_t* p, uint32_t (&w)[(N + 1) / 2]) {
  if constexpr (N == 1) {
    w[0] = __ldg(p);
  } else if constexpr (N == 2) {
    w[0] = __ldg(reinterpret_cast<const uint32_t*>(p));
  } else {
    static_assert(N == 4, "1, 2 or 4 values");
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x, w[1] = v.y;
  }
}

// Lane t's chunks of lane block lb (quads lb·L ..) of the tile's rows, and its units' scales and
// biases; zeros past the end of the row when FULL is false (only the last block may reach past it).
// With L / G > 1 the units are groups, consecutive ones (with_lane_layout).
template <int BITS, int L, int G, bool FULL>
__device__ __forceinline__ void load_lane_block(const WeightArgs& W, const TileRows& tr, int lb, int t,
                                                LaneBlock<BITS, L, G>& blk) {
  constexpr int UNITS = L / G;
  const int nchunks = W.cols / kChunk;
  const int c = chunk_of(L, lb * L, t);  // its first chunk
  const size_t off = size_t(lb) * (kQuadChunks * L * kChunk * BITS / 8);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (FULL) {
      load_words<L * BITS>(tr.w[h] + off, &blk.w[h][0][0]);
    } else {
#pragma unroll
      for (int s = 0; s < L; ++s) {
        if (c + s < nchunks) {
          load_chunk<BITS>(tr.w[h] + off + s * (kChunk * BITS / 8), blk.w[h][s]);
        } else {
#pragma unroll
          for (int i = 0; i < BITS; ++i) blk.w[h][s][i] = 0;
        }
      }
    }
    const uint32_t gi = tr.s[h] + (uint32_t(c) >> W.chunks_per_group_log2);
    if (FULL) {
      load_bf16s<UNITS>(W.scales + gi, blk.scale[h]);
      load_bf16s<UNITS>(W.biases + gi, blk.bias[h]);
    } else {
#pragma unroll
      for (int i = 0; i < blk.kWords; ++i) blk.scale[h][i] = blk.bias[h][i] = 0;
#pragma unroll
      for (int u = 0; u < UNITS; ++u) {
        if (c + u * G < nchunks) {
          blk.scale[h][u / 2] |= uint32_t(__ldg(W.scales + gi + u)) << (16 * (u % 2));
          blk.bias[h][u / 2] |= uint32_t(__ldg(W.biases + gi + u)) << (16 * (u % 2));
        }
      }
    }
  }
}

// c[m][tt] += lane (g, t)'s MMAs over quad q of the codes w_g, w_g8 of its chunk of rows g and
// g + 8, for token tt of X.
template <int BITS, int L, int TT>
__device__ __forceinline__ void mma_accumulate(const StagedX& X, int q, const uint32_t (&w_g)[BITS],
                                               const uint32_t (&w_g8)[BITS], int (&c)[2][TT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // The B column this lane supplies in each MMA: bytes g / 4 and g / 4 + 2 of segment g % 4, the
  // two entries from `own`. Only the 8 lanes whose segment is their own (g % 4 == t) have any:
  // with wide_b they alone load, 16 bytes each over all the banks, one shared-memory wavefront a
  // step. Otherwise every lane loads two 8-byte entries, the others from the quad of zeros 1 entry
  // in, where their words fall in banks the 8 leave free (8t + 0, 1, 4, 5 for the first entry,
  // 8t + 2, 3, 6, 7 for the second), one wavefront a load.
  const bool own = (g & 3) == t;
  const uint2* own_entries = X.xb + size_t(q) * quad_entries(X.tokens) + t * kMmaParts + 2 * (g >> 2);
  const uint2* bp = wide_b(L) || own ? own_entries : X.xb + size_t(X.nquads) * quad_entries(X.tokens) + 1;
#pragma unroll
  for (int j = 0; j < kMmaSteps; ++j) {
    uint2 b[2][TT];
#pragma unroll
    for (int tt = 0; tt < TT; ++tt) {
      const uint2* e = bp + (j * X.tokens + X.tt0 + tt) * kQuadChunks * kMmaParts;
      if constexpr (wide_b(L)) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (own) v = *reinterpret_cast<const uint4*>(e);
        b[0][tt] = make_uint2(v.x, v.y), b[1][tt] = make_uint2(v.z, v.w);
      } else {
        b[0][tt] = e[0], b[1][tt] = e[1];
      }
    }
    const uint2 a_g = decode_step<BITS>(w_g, j), a_g8 = decode_step<BITS>(w_g8, j);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int tt = 0; tt < TT; ++tt) mma_u8s8(c[m][tt], a_g, a_g8, b[m][tt]);
  }
}

// acc[h][tt] += lane (g, t)'s share of unit u of lane block lb of rows g + 8h of W · x_tt, from
// its MMA sums c over the unit's quads (x_tt: token tt of X). f16: the scales and biases are f16.
template <int BITS, int L, int G, int TT>
__device__ __forceinline__ void mma_flush(const StagedX& X, int lb, int u, const LaneBlock<BITS, L, G>& blk,
                                          bool f16, const int (&c)[2][TT][4], float (&acc)[2][TT]) {
  constexpr int UNITS = L / G;
  const int lane = threadIdx.x & 31, t = lane & 3;
  // C[g + 8h][2t + i] is byte t / 2 of segment 2(t % 2) + i in the first MMA, byte t / 2 + 2 in
  // the second: together 256^(t/2)·(C0 + 65536·C1) of that segment's Σ code·X. A segment is a
  // lane's chunk; its unit is (lb·4 + that lane)·UNITS + u, and its scale that lane's (the lanes
  // of a row are adjacent).
  const float k0 = t >= 2 ? 256.f : 1.f, k1 = k0 * 65536.f;
  float seg_scale[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      seg_scale[h][i] = __shfl_sync(0xffffffffu, unit_value(blk.scale[h], u, f16), (lane & ~3) | (2 * (t & 1) + i));
  const int unit0 = lb * kQuadChunks * UNITS + u;
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    const int unit = (X.tt0 + tt) * X.nquads * kQuadChunks + unit0;
    const float* p2 = X.pow2 + unit + 2 * (t & 1) * UNITS;
    const float xs = X.xsum[unit + t * UNITS];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float a = acc[h][tt];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float v = fmaf(float(c[1][tt][2 * h + i]), k1, float(c[0][tt][2 * h + i]) * k0);
        a = fmaf(v * p2[i * UNITS], seg_scale[h][i], a);
      }
      acc[h][tt] = fmaf(unit_value(blk.bias[h], u, f16), xs, a);
    }
  }
}

// acc[h][tt] += lane (g, t)'s share of lane block lb of rows g + 8h of W · x_tt: the G quads of
// each unit summed exactly in int32 (they share a scale and X a power of two), then scaled once.
template <int BITS, int L, int G, int TT>
__device__ __forceinline__ void mma_dot_block(const StagedX& X, int lb, const LaneBlock<BITS, L, G>& blk, bool f16,
                                              float (&acc)[2][TT]) {
#pragma unroll
  for (int u = 0; u < L / G; ++u) {
    int c[2][TT][4] = {};
#pragma unroll
    for (int s = 0; s < G; ++s)
      mma_accumulate<BITS, L, TT>(X, lb * L + u * G + s, blk.w[0][u * G + s], blk.w[1][u * G + s], c);
    mma_flush<BITS, L, G, TT>(X, lb, u, blk, f16, c, acc);
  }
}

// Lane blocks loaded together before any computes, by default: about 32 bytes a lane and row in
// flight; more lost bandwidth (docs/PERFORMANCE.md#cuda-matvec).
template <int BITS, int L>
inline constexpr int kBlocksAtOnce = BITS * L >= 8 ? 1 : 2;

// acc[m][h][tt] += lane (g, t)'s share of rows r0 + g + 8h of W[m] · x_tt over lane blocks [b0, b1),
// the M matrices (of the same columns) loaded together, U lane blocks at once. The four lanes of
// a g hold shares of the same rows whose sum is the dot product.
template <int BITS, int L, int G, int U, int TT, int M>
__device__ __forceinline__ void mma_dot_rows(const StagedX& X, const WeightArgs (&W)[M], int r0, int b0, int b1,
                                             float (&acc)[M][2][TT]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int full_end = min(b1, W[0].cols / (kChunk * kQuadChunks * L));
  TileRows rows[M];
  bool f16[M];  // the matrix's scales and biases are f16 rather than bf16
#pragma unroll
  for (int m = 0; m < M; ++m) rows[m] = tile_rows<BITS, L>(W[m], r0, g, t), f16[m] = W[m].scale_type == ScaleType::F16;
  int b = b0;
  for (; b + U <= full_end; b += U) {
    LaneBlock<BITS, L, G> blk[M][U];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int u = 0; u < U; ++u) load_lane_block<BITS, L, G, true>(W[m], rows[m], b + u, t, blk[m][u]);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int u = 0; u < U; ++u) mma_dot_block<BITS, L, G, TT>(X, b + u, blk[m][u], f16[m], acc[m]);
  }
  for (; b < b1; ++b) {
    LaneBlock<BITS, L, G> blk[M];
#pragma unroll
    for (int m = 0; m < M; ++m) load_lane_block<BITS, L, G, false>(W[m], rows[m], b, t, blk[m]);
#pragma unroll
    for (int m = 0; m < M; ++m) mma_dot_block<BITS, L, G, TT>(X, b, blk[m], f16[m], acc[m]);
  }
}

// The lane blocks [b0, b1) of a row that warp `warp` takes when ks = 2^ks_log2 warps split them.
__device__ __forceinline__ int2 warp_blocks(int nblocks, int ks_log2, int warp) {
  const int per_warp = (nblocks + (1 << ks_log2) - 1) >> ks_log2, b0 = (warp & ((1 << ks_log2) - 1)) * per_warp;
  return make_int2(b0, min(b0 + per_warp, nblocks));
}

// The first row of the 16-row tile of row set `set` that this warp (of WARPS) takes when ks =
// 2^ks_log2 warps split each tile's lane blocks.
template <int WARPS>
__device__ __forceinline__ int tile_row0(int set, int ks_log2) {
  return (set * (WARPS >> ks_log2) + (int(threadIdx.x >> 5) >> ks_log2)) * 16;
}

// Row sets of `rows` rows when ks = 2^ks_log2 of `warps` warps split each tile's lane blocks.
__host__ __device__ inline int mma_sets(int rows, int warps, int ks_log2) {
  const int rows_per_set = (warps >> ks_log2) * 16;
  return (rows + rows_per_set - 1) / rows_per_set;
}

// The dot products of the rows of M matrices (of the same shape) with the TT tokens of X, over
// this block's row sets (blockIdx.x, + gridDim.x, ...; (WARPS / ks)·16 rows each): a warp takes a
// 16-row tile of each set and its share of the tile's lane blocks (warp_blocks; ks = 2^ks_log2),
// U at once, and the ks partial sums meet in `partial` ([WARPS][M][16][TT] floats of shared
// memory), added in a fixed order. store(row, tt, v) gets v[m] = W[m] row · x_tt once for each row.
// Every thread of the block calls it; with ks = 1 there are no barriers.
template <int BITS, int L, int G, int U, int TT, int M, int WARPS, class Store>
__device__ __forceinline__ void mma_row_sets(const StagedX& X, const WeightArgs (&W)[M], int ks_log2, float* partial,
                                             Store&& store) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const int ks = 1 << ks_log2, rows_per_set = (WARPS >> ks_log2) * 16, rows = W[0].rows;
  const int2 blocks = warp_blocks(X.nquads / L, ks_log2, warp);
  const int nsets = mma_sets(rows, WARPS, ks_log2);
  for (int set = blockIdx.x; set < nsets; set += gridDim.x) {  // uniform over the block
    const int r0 = tile_row0<WARPS>(set, ks_log2);
    float acc[M][2][TT] = {};
    mma_dot_rows<BITS, L, G, U, TT, M>(X, W, r0, blocks.x, blocks.y, acc);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int tt = 0; tt < TT; ++tt) acc[m][h][tt] = sum_lanes(acc[m][h][tt], 4);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int tt = 0; tt < TT; ++tt) {
          float v[M];
#pragma unroll
          for (int m = 0; m < M; ++m) v[m] = acc[m][h][tt];
          if (ks_log2 == 0) {  // the warp's own rows: no partial sums to meet
            if (r0 + 8 * h + g < rows) store(r0 + 8 * h + g, tt, v);
          } else {
#pragma unroll
            for (int m = 0; m < M; ++m) partial[((warp * M + m) * 16 + 8 * h + g) * TT + tt] = v[m];
          }
        }
    }
    if (ks_log2 == 0) continue;
    __syncthreads();
    // A row's ks partial sums meet in ks adjacent lanes (sum_lanes: a fixed order), WARPS·16·TT
    // of them, a whole number of warps, rather than in one thread a row; and the last set skips
    // the barrier after it. The sum sits on the critical path (docs/PERFORMANCE.md#cuda-matvec).
    for (int e = threadIdx.x; e < WARPS * 16 * TT; e += WARPS * 32) {
      const int j = e & (ks - 1), r = (e >> ks_log2) / TT, tt = (e >> ks_log2) % TT;
      float v[M];
#pragma unroll
      for (int m = 0; m < M; ++m)
        v[m] = sum_lanes(partial[(((((r / 16) << ks_log2) + j) * M + m) * 16 + r % 16) * TT + tt], ks);
      if (j == 0 && set * rows_per_set + r < rows) store(set * rows_per_set + r, tt, v);
    }
    if (set + int(gridDim.x) < nsets) __syncthreads();  // all have read `partial` before the next set writes it
  }
}

// ks_log2 for mma_row_sets: the fewest rounds of row sets (times token_blocks) over the resident
// blocks, each round nblocks / ks lane blocks plus about one block of overhead (the barriers, the
// sum of the partial rows, the first loads).
inline int mma_split_log2(int rows, int nblocks, long token_blocks, int resident, int warps) {
  auto cost = [&](int ks_log2) {
    const long rounds = (mma_sets(rows, warps, ks_log2) * token_blocks + resident - 1) / resident;
    return rounds * ((nblocks + (1 << ks_log2) - 1) / (1 << ks_log2) + 1);
  };
  int best = 0;
  for (int k = 1; (1 << k) <= warps && (1 << k) <= nblocks; ++k)
    if (cost(k) < cost(best)) best = k;
  return best;
}

// Asks the L2 for the first U lane blocks mma_dot_rows will read (rows r0.., blocks b0..), before
// the block stages x.
template <int BITS, int L, int U>
__device__ __forceinline__ void prefetch_rows(const WeightArgs& W, int r0, int b0, int b1) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const TileRows tr = tile_rows<BITS, L>(W, r0, g, t);
  for (int b = b0; b < min(b1, b0 + U); ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (chunk_of(L, b * L, t) < W.cols / kChunk)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(tr.w[h] + size_t(b) * (kQuadChunks * L * kChunk * BITS / 8)));
}

}  // namespace ms::cuda
