// cuda::int_matmul and cuda::int_experts (int_gemm.h): kernels/int_dot.h's product on the integer
// tensor cores. Two kernels: split_kernel turns x into int_dot.h's split rows (a thread per unit,
// Σx summed left to right), and gemm_kernel multiplies them by affine rows. A warp takes MT
// 16-row tiles by NT 8-token tiles; per chunk of 32 columns a lane decodes its word of each of
// its rows' codes into A registers (the slot order is the decoding's) and loads its two 16-byte
// quads of each token's split chunk (all four byte parts) as B, and the MMAs sum codes × bytes in
// int32 over a unit; the unit's four sums then meet in int64 and join the lane's float sums in
// int_dot.h's order. No sum is split between lanes or blocks: the bits do not depend on the grid.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/int_gemm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma_dot.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/stream.h"
#include "kernels/int_dot.h"

namespace ms::cuda {
namespace {

constexpr int kWarps = 4;           // a block's warps, stacked over rows
constexpr int kSplitThreads = 128;  // split_kernel's block

// A tile of tokens: the users [first, first + count) of matrix `mat` (one expert), or of the
// token rows themselves for a dense product.
struct Item {
  int mat, first, count;
};

// What gemm_kernel reads and writes. Users are rows of the split input (through in_rows where
// given) and of the output (through out_rows, scaled by out_scale, where given).
struct GemmArgs {
  const uint8_t* xs;  // split rows [.][cols·4]
  const float* pow2;  // [.][units]
  const float* xsum;  // [.][units]
  int cols, units, group, rows;
  ScaleType scale_type;
  const IntExpertMat* mats;  // [M][n_mats]: blockIdx.z picks the first index; null: `single`
  int n_mats;
  IntExpertMat single;
  const Item* items;  // [gridDim.y]; null: dense, tiles of the T tokens
  int T;
  const int* in_rows;
  float* out[2];  // by blockIdx.z
  int out_ld;
  const int* out_rows;
  const float* out_scale;
};

// Unit by unit the split of x: X's four bytes in the slot order of BITS-bit codes, 2^e and Σx
// (int_dot.h). Thread i takes unit i % units of row i / units.
template <int BITS>
__global__ void __launch_bounds__(kSplitThreads) split_kernel(const float* __restrict__ x, int n, int cols, int unit,
                                                              uint8_t* __restrict__ xs, float* __restrict__ pow2,
                                                              float* __restrict__ xsum) {
  const int units = cols / unit;
  const long i = long(blockIdx.x) * kSplitThreads + threadIdx.x;
  if (i >= long(n) * units) return;
  const int r = int(i / units), u = int(i % units);
  const float* src = x + size_t(r) * cols + size_t(u) * unit;
  float mx = 0.f, sum = 0.f;
  for (int c = 0; c < unit; c += 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(src + c));
    mx = fmaxf(fmaxf(mx, fabsf(v.x)), fmaxf(fabsf(v.y), fmaxf(fabsf(v.z), fabsf(v.w))));
    sum = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(sum, v.x), v.y), v.z), v.w);
  }
  const bool finite = isfinite(mx) && isfinite(sum);
  const int e = finite ? int_dot::unit_exponent(mx) : 0;
  pow2[i] = finite ? int_dot::pow2(e) : __int_as_float(0x7fc00000);
  xsum[i] = sum;
  const float h1 = int_dot::half_scale1(e), h2 = int_dot::half_scale2(e);
  uint4* dst = reinterpret_cast<uint4*>(xs + (size_t(r) * cols + size_t(u) * unit) * int_dot::kParts);
  for (int ch = 0; ch < unit / int_dot::kChunk; ++ch) {
    const float* cx = src + ch * int_dot::kChunk;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      uint32_t w[int_dot::kParts] = {};
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float v = cx[int_dot::code_of_slot(BITS, 4 * q + m)];
        const uint32_t d = int_dot::digits(finite ? __float2int_rn(__fmul_rn(__fmul_rn(v, h1), h2)) : 0);
#pragma unroll
        for (int p = 0; p < int_dot::kParts; ++p) w[p] |= ((d >> (8 * p)) & 0xffu) << (8 * m);
      }
      dst[ch * 8 + q] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// A registers of a lane's word(s) of chunk ch of a row: [0] for k slots 4t.., [1] for 16 + 4t...
template <int BITS>
__device__ __forceinline__ uint2 row_codes(const uint8_t* row, int ch, int t) {
  if constexpr (BITS == 4) {
    const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(row + ch * 16) + t);
    return make_uint2(w & 0x0F0F0F0Fu, (w >> 4) & 0x0F0F0F0Fu);
  } else {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(row + ch * 32);
    return make_uint2(__ldg(p + t), __ldg(p + 4 + t));
  }
}

// Chunk ch's operands: A from the lane's rows, B from its tokens' split rows.
template <int BITS, int MT, int NT>
__device__ __forceinline__ void load_chunk(const uint8_t* const (&arow)[MT][2], const uint8_t* const (&brow)[NT], int ch,
                                           int t, uint2 (&A)[MT][2], uint4 (&B)[NT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) A[mt][h] = row_codes<BITS>(arow[mt][h], ch, t);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint4* bq = reinterpret_cast<const uint4*>(brow[nt] + size_t(ch) * int_dot::kChunkBytes);
    B[nt][0] = __ldg(bq + t), B[nt][1] = __ldg(bq + 4 + t);
  }
}

// The MMAs of one chunk's operands into c.
template <int MT, int NT>
__device__ __forceinline__ void mma_chunk(int (&c)[MT][NT][int_dot::kParts][4], const uint2 (&A)[MT][2],
                                          const uint4 (&B)[NT][2]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint4 b0 = B[nt][0], b1 = B[nt][1];
    const uint2 b[int_dot::kParts] = {make_uint2(b0.x, b1.x), make_uint2(b0.y, b1.y), make_uint2(b0.z, b1.z),
                                      make_uint2(b0.w, b1.w)};
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int p = 0; p < int_dot::kParts; ++p) mma_u8s8(c[mt][nt][p], A[mt][0], A[mt][1], b[p]);
  }
}

// CPU: the unit's chunks (group / 32) when known at compile time, whose loads then all issue
// before their MMAs; 0 takes them one after another.
template <int BITS, int MT, int NT, int CPU>
__global__ void __launch_bounds__(kWarps * 32) gemm_kernel(GemmArgs a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const Item it = a.items ? a.items[blockIdx.y]
                          : Item{0, int(blockIdx.y) * 8 * NT, min(8 * NT, a.T - int(blockIdx.y) * 8 * NT)};
  if (it.count <= 0) return;  // a slot another device computes (int_expert_records); no barriers below
  const IntExpertMat W = a.mats ? a.mats[blockIdx.z * a.n_mats + it.mat] : a.single;
  const int row0 = (int(blockIdx.x) * kWarps + warp) * 16 * MT;
  if (row0 >= a.rows) return;
  auto split_row = [&](int n) {  // the split row of the tile's token n (the last one past count)
    const int idx = it.first + min(n, it.count - 1);
    return a.in_rows ? a.in_rows[idx] : idx;
  };
  const size_t split_bytes = size_t(a.cols) * int_dot::kParts;
  const uint8_t* brow[NT];  // this lane's B token (g) of each token tile
  int crow[NT][2];          // the split rows of its C tokens (2t, 2t + 1)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    brow[nt] = a.xs + size_t(split_row(nt * 8 + g)) * split_bytes;
    crow[nt][0] = split_row(nt * 8 + 2 * t), crow[nt][1] = split_row(nt * 8 + 2 * t + 1);
  }
  const size_t row_bytes = size_t(a.cols) * BITS / 8;
  const uint8_t* arow[MT][2];  // rows g and g + 8 of each row tile (clamped to the last)
  uint32_t grow[MT][2];        // their first group
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = min(row0 + mt * 16 + g + 8 * h, a.rows - 1);
      arow[mt][h] = W.q + size_t(r) * row_bytes, grow[mt][h] = uint32_t(r) * uint32_t(a.units);
    }
  float acc[MT][NT][4] = {};
  for (int u = 0; u < a.units; ++u) {
    int c[MT][NT][int_dot::kParts][4] = {};
    if constexpr (CPU > 0) {
      uint2 A[CPU][MT][2];
      uint4 B[CPU][NT][2];
#pragma unroll
      for (int s = 0; s < CPU; ++s) load_chunk<BITS, MT, NT>(arow, brow, u * CPU + s, t, A[s], B[s]);
#pragma unroll
      for (int s = 0; s < CPU; ++s) mma_chunk<MT, NT>(c, A[s], B[s]);
    } else {
      const int chunks_per_unit = a.group / int_dot::kChunk;
      for (int s = 0; s < chunks_per_unit; ++s) {
        uint2 A[MT][2];
        uint4 B[NT][2];
        load_chunk<BITS, MT, NT>(arow, brow, u * chunks_per_unit + s, t, A, B);
        mma_chunk<MT, NT>(c, A, B);
      }
    }
    float sc[MT][2], bi[MT][2], p2[NT][2], xs[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sc[mt][h] = scale_at(W.scales, grow[mt][h] + u, a.scale_type),
        bi[mt][h] = scale_at(W.biases, grow[mt][h] + u, a.scale_type);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        p2[nt][i] = __ldg(a.pow2 + size_t(crow[nt][i]) * a.units + u),
        xs[nt][i] = __ldg(a.xsum + size_t(crow[nt][i]) * a.units + u);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // C element e: row g + 8(e / 2), token 2t + e % 2
          const int h = e >> 1, i = e & 1;
          const int* cp = &c[mt][nt][0][0];
          const float v = __ll2float_rn(int_dot::combine(cp[e], cp[4 + e], cp[8 + e], cp[12 + e]));
          float r = fmaf(v, __fmul_rn(sc[mt][h], p2[nt][i]), acc[mt][nt][e]);
          acc[mt][nt][e] = fmaf(bi[mt][h], xs[nt][i], r);
        }
  }
  float* out = blockIdx.z ? a.out[1] : a.out[0];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + mt * 16 + g + 8 * (e >> 1), n = nt * 8 + 2 * t + (e & 1);
        if (row >= a.rows || n >= it.count) continue;
        const int idx = it.first + n;
        if (a.out_rows)
          out[size_t(a.out_rows[idx]) * a.out_ld + row] = __fmul_rn(a.out_scale[idx], acc[mt][nt][e]);
        else
          out[size_t(idx) * a.out_ld + row] = acc[mt][nt][e];
      }
}

// x's split as gemm_kernel reads it, for BITS-bit weights in units of `unit` columns.
struct Split {
  DeviceArray<uint8_t> bytes;
  DeviceArray<float> pow2, xsum;
};

// split_kernel over n rows into xs [n][cols·4], pow2 and xsum [n][cols / unit].
template <int BITS>
void split_into(const float* x, int n, int cols, int unit, uint8_t* xs, float* pow2, float* xsum) {
  const size_t units = size_t(n) * size_t(cols / unit);
  const unsigned blocks = unsigned((units + kSplitThreads - 1) / kSplitThreads);
  split_kernel<BITS><<<blocks, kSplitThreads, 0, compute_stream()>>>(x, n, cols, unit, xs, pow2, xsum);
  CUDA_CHECK_LAUNCH();
}

template <int BITS>
Split split(const float* x, int n, int cols, int unit) {
  const size_t units = size_t(n) * size_t(cols / unit);
  Split s{DeviceArray<uint8_t>(size_t(n) * size_t(cols) * int_dot::kParts), DeviceArray<float>(units),
          DeviceArray<float>(units)};
  split_into<BITS>(x, n, cols, unit, s.bytes.data(), s.pow2.data(), s.xsum.data());
  return s;
}

// h[i] = int_dot::silu(h[i]) · u[i]: the experts' activation in the bits cpu::int_expert gives.
__global__ void silu_mul_exact_kernel(float* h, const float* __restrict__ u, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (i < n) h[i] = __fmul_rn(int_dot::silu(h[i]), u[i]);
}

void silu_mul_exact(float* h, const float* u, int64_t n) {
  if (n <= 0) return;
  silu_mul_exact_kernel<<<unsigned((n + 255) / 256), 256, 0, compute_stream()>>>(h, u, n);
  CUDA_CHECK_LAUNCH();
}

// int_expert_records' items and matrices from the records: slot k is item k (one user, token row
// 0, output row k), skipped (count 0) where records[k] is null.
__global__ void record_items_kernel(const uint8_t* const* records, int K, RecordMat gate, RecordMat up,
                                    RecordMat down, Item* items, IntExpertMat* mats, int* in_rows, int* out_rows) {
  const int k = int(blockIdx.x) * 32 + int(threadIdx.x);
  if (k >= K) return;
  const uint8_t* r = records[k];
  items[k] = {k, k, r ? 1 : 0};
  in_rows[k] = 0, out_rows[k] = k;
  const RecordMat* p[3] = {&gate, &up, &down};
  for (int m = 0; m < 3; ++m)
    mats[m * K + k] = r ? IntExpertMat{r + p[m]->q_offset, reinterpret_cast<const uint16_t*>(r + p[m]->scales_offset),
                                       reinterpret_cast<const uint16_t*>(r + p[m]->biases_offset)}
                        : IntExpertMat{nullptr, nullptr, nullptr};
}

// int_expert_records' scratch, carved in order; each part 16-byte aligned.
struct RecordScratch {
  Item* items;
  IntExpertMat* mats;
  int *in_rows, *out_rows;
  uint8_t *xs, *hs;       // x's split [H·4], h's [K][I·4]
  float *xp, *xsum;       // x's 2^e and Σx [H / group]
  float *hp, *hsum;       // h's [K][I / down group]
  float *h, *u;           // [K][I]
  size_t bytes;
};

RecordScratch carve_scratch(uint8_t* base, int K, const RecordMat (&proj)[3]) {
  const size_t H = size_t(proj[0].cols), I = size_t(proj[0].rows), k = size_t(K);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    uint8_t* p = base ? base + at : nullptr;
    at += (bytes + 15) / 16 * 16;
    return p;
  };
  RecordScratch s{};
  s.items = reinterpret_cast<Item*>(take(k * sizeof(Item)));
  s.mats = reinterpret_cast<IntExpertMat*>(take(3 * k * sizeof(IntExpertMat)));
  s.in_rows = reinterpret_cast<int*>(take(k * sizeof(int)));
  s.out_rows = reinterpret_cast<int*>(take(k * sizeof(int)));
  s.xs = take(H * int_dot::kParts);
  s.xp = reinterpret_cast<float*>(take(H / size_t(proj[0].group) * sizeof(float)));
  s.xsum = reinterpret_cast<float*>(take(H / size_t(proj[0].group) * sizeof(float)));
  s.hs = take(k * I * int_dot::kParts);
  s.hp = reinterpret_cast<float*>(take(k * I / size_t(proj[2].group) * sizeof(float)));
  s.hsum = reinterpret_cast<float*>(take(k * I / size_t(proj[2].group) * sizeof(float)));
  s.h = reinterpret_cast<float*>(take(k * I * sizeof(float)));
  s.u = reinterpret_cast<float*>(take(k * I * sizeof(float)));
  s.bytes = at;
  return s;
}

template <int BITS, int MT, int NT, int CPU>
void launch_kernel(const GemmArgs& a, unsigned tiles, unsigned mats) {
  const dim3 grid(unsigned((a.rows + kWarps * 16 * MT - 1) / (kWarps * 16 * MT)), tiles, mats);
  gemm_kernel<BITS, MT, NT, CPU><<<grid, kWarps * 32, 0, compute_stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <int BITS, int MT, int NT>
void launch_unrolled(const GemmArgs& a, unsigned tiles, unsigned mats, bool unroll) {
  switch (unroll ? a.group / int_dot::kChunk : 0) {
    case 1: return launch_kernel<BITS, MT, NT, 1>(a, tiles, mats);
    case 2: return launch_kernel<BITS, MT, NT, 2>(a, tiles, mats);
    case 4: return launch_kernel<BITS, MT, NT, 4>(a, tiles, mats);
    default: return launch_kernel<BITS, MT, NT, 0>(a, tiles, mats);
  }
}

// gemm_kernel with the warp tile t over `tiles` token tiles (8·t.nt tokens each) and `mats`.
template <int BITS>
void launch_gemm(const GemmArgs& a, unsigned tiles, unsigned mats, IntGemmTiles t) {
  const int mn = t.mt * 10 + t.nt;
  switch (mn) {
    case 14: return launch_unrolled<BITS, 1, 4>(a, tiles, mats, t.unroll);
    case 12: return launch_unrolled<BITS, 1, 2>(a, tiles, mats, t.unroll);
    case 22: return launch_unrolled<BITS, 2, 2>(a, tiles, mats, t.unroll);
    case 42: return launch_unrolled<BITS, 4, 2>(a, tiles, mats, t.unroll);
    default: arg_fail("cuda::int_gemm: no warp tile of " + std::to_string(t.mt) + " x " + std::to_string(t.nt));
  }
}

Mat layout_mat(const RecordMat& p) {
  Mat m;
  m.type = WeightType::Affine, m.rows = p.rows, m.cols = p.cols, m.bits = p.bits, m.group = p.group;
  m.scale_type = p.scale_type;
  return m;
}

bool layout_of(const Mat& W) {
  return W.type == WeightType::Affine && int_dot::layout_supported(W.bits, W.group, W.scale_type) &&
         W.cols % W.group == 0 && W.cols > 0 && W.rows > 0;
}

std::string layout_name(const Mat& W) {
  return std::to_string(W.bits) + "-bit group " + std::to_string(W.group) + " " + scale_type_name(W.scale_type);
}

}  // namespace

bool int_gemm_layout(const Mat& W) { return layout_of(W); }

bool int_matmul_pays(const Mat& W, int T) {
  return T >= kIntMatmulMinTokens && int64_t(W.rows) * T >= kIntMatmulMinWork && layout_of(W);
}

void int_matmul(const float* x, int T, const Mat& W, float* y) { int_matmul(x, T, W, y, kDenseTiles); }

void int_matmul(const float* x, int T, const Mat& W, float* y, IntGemmTiles tiles) {
  if (!layout_of(W)) arg_fail("cuda::int_matmul: no integer kernel for " + layout_name(W) + " weights");
  if (!aligned(x, 16) || !aligned(y, 16) || !aligned(W.data, 16))
    arg_fail("cuda::int_matmul: x, y and the weights must be 16-byte aligned");
  if (T <= 0) return;
  const int tile_tokens = 8 * tiles.nt;
  if ((T + tile_tokens - 1) / tile_tokens > 65535)
    arg_fail("cuda::int_matmul: T " + std::to_string(T) + " tokens in one call; split the batch");
  with_bits<4, 8>(W.bits, "cuda::int_matmul", [&](auto B) {
    const Split s = split<B>(x, T, W.cols, W.group);
    GemmArgs a{s.bytes.data(), s.pow2.data(), s.xsum.data(), W.cols, W.cols / W.group, W.group, W.rows,
               W.scale_type, nullptr, 1, {static_cast<const uint8_t*>(W.data), W.scales, W.biases}, nullptr, T,
               nullptr, {y, nullptr}, W.rows, nullptr, nullptr};
    launch_gemm<B>(a, unsigned((T + tile_tokens - 1) / tile_tokens), 1, tiles);
  });
}

bool int_experts_layout(const Mat& gate, const Mat& up, const Mat& down) {
  return layout_of(gate) && layout_of(up) && layout_of(down) && int_dot::expert_shapes_match(gate, up, down);
}

void int_experts(const IntExperts& e, const float* x, int T, float* partial) {
  const bool wide = e.n > 0 && e.users_total >= kWideExpertUsers * e.n;
  int_experts(e, x, T, partial, wide ? kWideExpertTiles : kExpertTiles);
}

void int_experts(const IntExperts& e, const float* x, int T, float* partial, IntGemmTiles tiles) {
  const Mat &gl = e.gate_layout, &dl = e.down_layout;
  if (!int_experts_layout(gl, gl, dl))
    arg_fail("cuda::int_experts: no integer kernel for gate/up " + layout_name(gl) + " [" + std::to_string(gl.rows) +
             ", " + std::to_string(gl.cols) + "] and down " + layout_name(dl) + " [" + std::to_string(dl.rows) + ", " +
             std::to_string(dl.cols) + "]");
  if (e.n <= 0 || T <= 0 || e.users_total <= 0) return;
  const int I = gl.rows, H = gl.cols, users = e.users_total;
  std::vector<Item> items;
  for (int i = 0; i < e.n; ++i)
    for (size_t f = e.begin[i]; f < e.end[i]; f += size_t(8 * tiles.nt))
      items.push_back({i, int(f), int(std::min<size_t>(size_t(8 * tiles.nt), e.end[i] - f))});
  if (items.empty()) return;
  if (items.size() > 65535) arg_fail("cuda::int_experts: " + std::to_string(items.size()) + " token tiles in one call");
  std::vector<IntExpertMat> mats(e.gate, e.gate + e.n);  // [gate | up | down]
  mats.insert(mats.end(), e.up, e.up + e.n);
  mats.insert(mats.end(), e.down, e.down + e.n);
  const DeviceArray<Item> d_items = DeviceArray<Item>::from_async(items);
  const DeviceArray<IntExpertMat> d_mats = DeviceArray<IntExpertMat>::from_async(mats);
  DeviceArray<float> h(size_t(users) * size_t(I)), u(size_t(users) * size_t(I));
  with_bits<4, 8>(gl.bits, "cuda::int_experts", [&](auto B) {
    const Split s = split<B>(x, T, H, gl.group);
    GemmArgs a{s.bytes.data(), s.pow2.data(), s.xsum.data(), H, H / gl.group, gl.group, I, gl.scale_type,
               d_mats.data(), e.n, {}, d_items.data(), 0, e.token_rows, {h.data(), u.data()}, I, nullptr, nullptr};
    launch_gemm<B>(a, unsigned(items.size()), 2, tiles);
  });
  silu_mul_exact(h.data(), u.data(), int64_t(users) * I);
  with_bits<4, 8>(dl.bits, "cuda::int_experts", [&](auto B) {
    const Split s = split<B>(h.data(), users, I, dl.group);
    GemmArgs a{s.bytes.data(), s.pow2.data(), s.xsum.data(), I, I / dl.group, dl.group, H, dl.scale_type,
               d_mats.data() + 2 * e.n, e.n, {}, d_items.data(), 0, nullptr, {partial, nullptr}, H, e.users, e.weights};
    launch_gemm<B>(a, unsigned(items.size()), 1, tiles);
  });
}

bool int_records_layout(const RecordMat (&proj)[3]) {
  return int_experts_layout(layout_mat(proj[0]), layout_mat(proj[1]), layout_mat(proj[2]));
}

size_t int_records_scratch_bytes(int K, const RecordMat (&proj)[3]) { return carve_scratch(nullptr, K, proj).bytes; }

void int_expert_records(const float* x, int K, const uint8_t* const* records, const float* weights,
                        const RecordMat (&proj)[3], float* partial, void* scratch) {
  if (!int_records_layout(proj))
    arg_fail("cuda::int_expert_records: no integer kernel for gate/up " + layout_name(layout_mat(proj[0])) +
             " and down " + layout_name(layout_mat(proj[2])));
  if (K <= 0) return;
  if (!aligned(x, 16) || !aligned(partial, 16) || !aligned(scratch, 16))
    arg_fail("cuda::int_expert_records: x, partial and scratch must be 16-byte aligned");
  const RecordScratch s = carve_scratch(static_cast<uint8_t*>(scratch), K, proj);
  const int H = proj[0].cols, I = proj[0].rows;
  record_items_kernel<<<unsigned((K + 31) / 32), 32, 0, compute_stream()>>>(records, K, proj[0], proj[1], proj[2],
                                                                            s.items, s.mats, s.in_rows, s.out_rows);
  CUDA_CHECK_LAUNCH();
  const RecordMat &gl = proj[0], &dl = proj[2];
  with_bits<4, 8>(gl.bits, "cuda::int_expert_records", [&](auto B) {
    split_into<B>(x, 1, H, gl.group, s.xs, s.xp, s.xsum);
    GemmArgs a{s.xs, s.xp, s.xsum, H, H / gl.group, gl.group, I, gl.scale_type, s.mats, K, {}, s.items, 0,
               s.in_rows, {s.h, s.u}, I, nullptr, nullptr};
    launch_gemm<B>(a, unsigned(K), 2, kExpertTiles);
  });
  silu_mul_exact(s.h, s.u, int64_t(K) * I);
  with_bits<4, 8>(dl.bits, "cuda::int_expert_records", [&](auto B) {
    split_into<B>(s.h, K, I, dl.group, s.hs, s.hp, s.hsum);
    GemmArgs a{s.hs, s.hp, s.hsum, I, I / dl.group, dl.group, H, dl.scale_type, s.mats + 2 * K, K, {}, s.items, 0,
               nullptr, {partial, nullptr}, H, s.out_rows, weights};
    launch_gemm<B>(a, unsigned(K), 1, kExpertTiles);
  });
}

}  // namespace ms::cuda
