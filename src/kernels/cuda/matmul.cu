// y = x · Wᵀ on the GPU for bf16, float32 and affine-quantized weights. Two kernels: bf16 and
// float32 weights decode to float for FMAs (weight_dot.cuh; a bf16 matvec of few rows, as the
// router's, has a kernel of its own, bf16_few_rows_kernel); affine codes, whose float decoding
// costs more instructions per byte than HBM delivers them at, go to the integer tensor cores as
// bytes against x in exact integer parts (mma_dot.cuh) where their layout allows
// (tensor_core_layout), else to the float kernel. Either stages the activations of TT tokens in
// shared memory once per block, and blocks loop over row sets (a grid of what fits on the chip),
// so that the weights, read once per TT tokens, are what streams from memory. gate_up_silu is the
// affine kernel over an MLP's gate and up together, its silu·up written instead of either product.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/int_gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/mma_dot.cuh"
#include "kernels/cuda/weight_dot.cuh"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 4;  // tokens per block when T > 1

// Launched overlapped (launch.cuh), as the affine kernel below: its launch and first loads hide
// under the kernel before (docs/PERFORMANCE.md#cuda-matvec).
// BITS: 16 for bf16 rows, 32 for float32, else affine ones of that width (weight_dot.cuh's dot_rows_of).
template <int BITS, int TT>
__global__ void __launch_bounds__(kThreads) float_matmul_kernel(const float* __restrict__ x, int T, WeightArgs W,
                                                                float* __restrict__ y, int split_log2) {
  constexpr int R = kFloatRows;
  extern __shared__ float4 xs[];  // [TT][nchunks][kChunkSlots]
  const int t0 = blockIdx.y * TT;
  grid_dependency_wait();  // x is the kernel before's output, y may be its input
  stage_activations<kThreads>(x + size_t(t0) * W.cols, TT, T - t0, W.cols, xs);

  const int split = 1 << split_log2, lane = threadIdx.x & (split - 1), grp = threadIdx.x >> split_log2;
  const int groups = kThreads >> split_log2;
  const int nsets = (W.rows + groups * R - 1) / (groups * R);
  const WeightArgs Ws[1] = {W};
  for (int set = blockIdx.x; set < nsets; set += gridDim.x) {  // uniform over the block
    const int r0 = (set * groups + grp) * R;
    float acc[1][R][TT] = {};
    dot_rows_of<BITS, TT, 1>(xs, Ws, r0, lane, split, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < TT; ++t) acc[0][r][t] = sum_lanes(acc[0][r][t], split);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TT; ++t)
          if (r0 + r < W.rows && t0 + t < T) y[size_t(t0 + t) * W.rows + size_t(r0 + r)] = acc[0][r][t];
    }
  }
  grid_dependents_may_start();
}

// A bf16 matvec (T = 1) of few rows for the chip, as the router's (512 experts and the shared
// expert's gate over hidden 2048): the kernel above gives each block 16 rows, so 33 of them would
// read the router while the other multiprocessors idle. Here a warp takes kFloatRows rows, lane l
// the 16-byte words l, l + 32, ... of each, and a block as few warps as spread the rows over every
// multiprocessor; a lane holds all its words (rows of up to kFewRowsCols columns), loaded before
// the wait: weights, which no kernel writes, stream while the kernel before runs (the norm that
// writes x, which lets this one launch as it begins). x is read from global memory (the L2), each
// lane only its own words of it. Faster for the router and for decode
// (docs/PERFORMANCE.md#cuda-matvec).
constexpr int kFewRowsWords = 8;                    // 16-byte words of a row a lane holds
constexpr int kFewRowsCols = 32 * 8 * kFewRowsWords;  // 8 bf16 weights a word
constexpr int kFewRowsMaxWarps = kThreads / 32;

// w (8 bf16 weights) · the 8 values a, b.
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
  auto lo = [](uint32_t v) { return __uint_as_float(v << 16); };
  auto hi = [](uint32_t v) { return __uint_as_float(v & 0xffff0000u); };
  const float s0 = fmaf(hi(w.y), a.w, fmaf(lo(w.y), a.z, fmaf(hi(w.x), a.y, lo(w.x) * a.x)));
  const float s1 = fmaf(hi(w.w), b.w, fmaf(lo(w.w), b.z, fmaf(hi(w.z), b.y, lo(w.z) * b.x)));
  return s0 + s1;
}

__global__ void __launch_bounds__(kThreads) bf16_few_rows_kernel(const float* __restrict__ x, WeightArgs W,
                                                                 float* __restrict__ y) {
  constexpr int R = kFloatRows, P = kFewRowsWords;
  const int lane = threadIdx.x & 31, r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  const int nwords = W.cols / 8;
  uint4 w[R][P];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint4* row = reinterpret_cast<const uint4*>(W.data + size_t(min(r0 + r, W.rows - 1)) * W.cols * 2);
#pragma unroll
    for (int i = 0; i < P; ++i) w[r][i] = lane + 32 * i < nwords ? __ldg(row + lane + 32 * i) : make_uint4(0, 0, 0, 0);
  }
  grid_dependency_wait();  // x is the kernel before's output, y may be its input
  float4 xv[P][2];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int k = lane + 32 * i;
    const float4* p = reinterpret_cast<const float4*>(x) + 2 * k;
    xv[i][0] = k < nwords ? __ldg(p) : make_float4(0.f, 0.f, 0.f, 0.f);
    xv[i][1] = k < nwords ? __ldg(p + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < P; ++i) acc += dot8(w[r][i], xv[i][0], xv[i][1]);
    acc = sum_lanes(acc, 32);
    if (lane == 0 && r0 + r < W.rows) y[r0 + r] = acc;
  }
  grid_dependents_may_start();
}

// Whether a matvec of W goes to bf16_few_rows_kernel: rows it holds whole, and no more of them than
// one block of its most warps a multiprocessor takes.
bool few_rows(const WeightArgs& W) {
  return W.cols <= kFewRowsCols && W.rows <= kFewRowsMaxWarps * kFloatRows * multiprocessors();
}

void launch_bf16_few_rows(const float* x, const WeightArgs& W, float* y) {
  static const bool overlap = overlaps(reinterpret_cast<const void*>(bf16_few_rows_kernel));
  const int warps = (W.rows + kFloatRows - 1) / kFloatRows, sms = multiprocessors();
  int per_block = 1;
  while (per_block < kFewRowsMaxWarps && (warps + per_block - 1) / per_block > sms) per_block *= 2;
  const unsigned blocks = unsigned((warps + per_block - 1) / per_block);
  launch_overlapped(bf16_few_rows_kernel, overlap, dim3(blocks), per_block * 32, 0, x, W, y);
}

constexpr int kMmaWarps = kThreads / 32;

// The tensor-core kernel (mma_row_sets): kMmaWarps / ks row sets a block, each warp a 16-row tile
// and a share of its lane blocks. Two or three blocks fit on a multiprocessor at T = 1 (kMatvecBlocksPerSm),
// or one of twice the warps (wide_blocks).
// Launched overlapped (launch.cuh): its launch and first weight prefetches overlap the kernel
// before. A block lets the next kernel start only once it is done: earlier, the next call's blocks
// took the free slots and slowed this one (docs/PERFORMANCE.md#cuda-matvec).
// Lane blocks a warp loads at once: 64 bytes a lane and row for 8-bit and 4-bit g32 rows at T = 1,
// where the registers for them leave room for two blocks a multiprocessor instead of three; at 2
// to 4 bits g64 that gained nothing or lost (docs/PERFORMANCE.md#cuda-matvec).
template <int BITS, int L, int G, int TT>
inline constexpr int kMatvecAtOnce = TT == 1 && (BITS == 8 || (BITS == 4 && G == 1)) ? 2 : kBlocksAtOnce<BITS, L>;

// With M = 2 (gate and up, at T = 1) the registers of both matrices' lane blocks leave room for two
// blocks a multiprocessor and the default lane blocks at once, as moe.cu's gate_up_mma_kernel.
template <int BITS, int L, int G, int TT, int M>
inline constexpr int kMatvecBlocksPerSm = M == 1 && TT == 1 && kMatvecAtOnce<BITS, L, G, TT> * BITS * L < 16 ? 3 : 2;

// Warps of a block. With TT > 1, those two blocks' warps as one block a multiprocessor, which
// stages the tokens once for all of them (docs/PERFORMANCE.md#cuda-matvec). At T = 1 two or
// three blocks of kMmaWarps fit on a multiprocessor, or with WIDE one of twice as many warps
// (wide_blocks).
template <int BITS, int L, int G, int TT, int M, bool WIDE>
inline constexpr int kMatvecWarps =
    TT == 1 ? (WIDE ? 2 * kMmaWarps : kMmaWarps) : kMmaWarps * kMatvecBlocksPerSm<BITS, L, G, TT, M>;

template <int BITS, int L, int G, int TT, int M, bool WIDE>
inline constexpr int kMatvecMinBlocks =
    std::max(1, kMatvecBlocksPerSm<BITS, L, G, TT, M> * kMmaWarps / kMatvecWarps<BITS, L, G, TT, M, WIDE>);

// The M matrices of one product, of one shape: W, or gate and up.
template <int M>
struct WeightSet {
  WeightArgs w[M];
};

// y = x · W[0]ᵀ, or with M = 2 y = silu(x · W[0]ᵀ) · (x · W[1]ᵀ) (silu_mul's formula), the MLP's gate
// and up in one launch.
template <int BITS, int L, int G, int TT, int M, bool WIDE>
__global__ void __launch_bounds__(kMatvecWarps<BITS, L, G, TT, M, WIDE> * 32, kMatvecMinBlocks<BITS, L, G, TT, M, WIDE>)
    matvec_mma_kernel(const float* __restrict__ x, int T, WeightSet<M> W, float* __restrict__ y, int ks_log2) {
  constexpr int U = M == 1 ? kMatvecAtOnce<BITS, L, G, TT> : kBlocksAtOnce<BITS, L>;
  constexpr int WARPS = kMatvecWarps<BITS, L, G, TT, M, WIDE>;
  extern __shared__ __align__(16) uint2 smem[];
  const int rows = W.w[0].rows, cols = W.w[0].cols;
  const SplitSmem s = split_smem<L>(smem, TT, cols);  // rest: partial sums [WARPS][M][16][TT]
  const int t0 = blockIdx.y * TT, warp = threadIdx.x >> 5;
  const int2 blocks = warp_blocks(s.nquads / L, ks_log2, warp);
#pragma unroll
  for (int m = 0; m < M; ++m) prefetch_rows<BITS, L, U>(W.w[m], tile_row0<WARPS>(blockIdx.x, ks_log2), blocks.x, blocks.y);
  grid_dependency_wait();  // x is the kernel before's output, y may be its input
  stage_split<BITS, L, G, WARPS * 32>(x + size_t(t0) * cols, TT, T - t0, cols, s.xb, s.pow2, s.xsum);
  mma_row_sets<BITS, L, G, U, TT, M, WARPS>(StagedX{s.xb, s.pow2, s.xsum, s.nquads, TT, 0}, W.w, ks_log2, s.rest,
                                                [&](int row, int tt, const float (&v)[M]) {
                                                  if (t0 + tt >= T) return;
                                                  y[size_t(t0 + tt) * rows + row] =
                                                      M == 1 ? v[0] : v[0] / (1.0f + expf(-v[0])) * v[M - 1];
                                                });
  grid_dependents_may_start();
}

size_t mma_smem_bytes(int TT, int cols, int L, int M, int warps) {
  return split_bytes(TT, cols, L) + size_t(warps) * M * 16 * TT * sizeof(float);
}

void check_token_blocks(int T, int TT) {
  if ((T + TT - 1) / TT > 65535) arg_fail("cuda::matmul: T " + std::to_string(T) + " tokens in one call; split the batch");
}

template <int BITS, int TT>
void launch_float(const float* x, int T, const WeightArgs& W, float* y) {
  constexpr int R = kFloatRows;
  auto kernel = float_matmul_kernel<BITS, TT>;
  static KernelLimits lim;
  const size_t smem = staged_bytes(TT, W.cols);
  const int resident = resident_blocks(kernel, kThreads, smem, lim, "cuda::matmul", W.cols);
  const int split_log2 = std::min(5, floor_log2(W.cols / kChunk));
  const int rows_per_set = (kThreads >> split_log2) * R;
  const int nsets = (W.rows + rows_per_set - 1) / rows_per_set;
  check_token_blocks(T, TT);
  const dim3 grid(unsigned(std::min(nsets, resident)), unsigned((T + TT - 1) / TT));
  launch_overlapped(kernel, lim.overlap, grid, kThreads, smem, x, T, W, y, split_log2);
}

template <int BITS>
void launch_float_tokens(const float* x, int T, const WeightArgs& W, float* y) {
  if (BITS == 16 && T == 1 && few_rows(W)) return launch_bf16_few_rows(x, W, y);
  if (T > 1 && staged_bytes(kBatch, W.cols) <= size_t(optin_smem()))
    launch_float<BITS, kBatch>(x, T, W, y);
  else
    launch_float<BITS, 1>(x, T, W, y);
}

template <int BITS, int L, int G, int TT, int M, bool WIDE = false>
void launch_mma(const float* x, int T, const WeightSet<M>& W, float* y) {
  auto kernel = matvec_mma_kernel<BITS, L, G, TT, M, WIDE>;
  constexpr int warps = kMatvecWarps<BITS, L, G, TT, M, WIDE>;
  static KernelLimits lim;
  const int rows = W.w[0].rows, cols = W.w[0].cols;
  const size_t smem = mma_smem_bytes(TT, cols, L, M, warps);
  const int resident = resident_blocks(kernel, warps * 32, smem, lim, "cuda::matmul", cols);
  const long token_blocks = (T + TT - 1) / TT;
  const int ks_log2 = mma_split_log2(rows, quads_of(cols, L) / L, token_blocks, resident, warps);
  check_token_blocks(T, TT);
  const dim3 grid(unsigned(std::min(mma_sets(rows, warps, ks_log2), resident)), unsigned(token_blocks));
  launch_overlapped(kernel, lim.overlap, grid, warps * 32, smem, x, T, W, y, ks_log2);
}

bool scales_fit(const WeightArgs& W) { return aligned(W.scales, 8) && aligned(W.biases, 8); }

// Whether a matvec (T = 1) of W goes to blocks of 2·kMmaWarps warps, one a multiprocessor: at 2 to
// 4 bits, where its rows have 4096 columns or more, which every block stages whole (its threads
// each convert 16 values or more of x; twice the threads halve that), and those blocks' row sets
// still fill the multiprocessors. At 8 bits (two blocks of kMmaWarps already fit), for narrower
// rows and for the 3-bit out_proj (64 row sets, half the multiprocessors idle) it lost
// (docs/PERFORMANCE.md#cuda-matvec).
constexpr int kWideCols = 4096;

template <int L>
bool wide_blocks(const WeightArgs& W) {
  if (W.cols < kWideCols) return false;
  const int sms = multiprocessors(), warps = 2 * kMmaWarps;
  const int ks_log2 = mma_split_log2(W.rows, quads_of(W.cols, L) / L, 1, sms, warps);
  return mma_sets(W.rows, warps, ks_log2) >= sms - sms / 16;
}

// T tokens one at a time a block (T = 1, or rows too wide to stage a batch of).
template <int BITS, int L, int G>
void launch_one_token(const float* x, int T, const WeightArgs& W, float* y) {
  if constexpr (BITS < 8) {
    if (T == 1 && wide_blocks<L>(W)) return launch_mma<BITS, L, G, 1, 1, true>(x, T, WeightSet<1>{{W}}, y);
  }
  launch_mma<BITS, L, G, 1, 1>(x, T, WeightSet<1>{{W}}, y);  // rows too wide to stage are refused (resident_blocks)
}

// Affine weights on the tensor cores, in the lane layout their rows allow.
template <int BITS>
void launch_affine(const float* x, int T, const WeightArgs& W, float* y) {
  with_lane_layout<BITS>(W.cols, W.chunks_per_group_log2, scales_fit(W), [&](auto L, auto G) {
    if (T > 1 && mma_smem_bytes(kBatch, W.cols, L, 1, kMatvecWarps<BITS, L, G, kBatch, 1, false>) <= size_t(optin_smem()))
      launch_mma<BITS, L, G, kBatch, 1>(x, T, WeightSet<1>{{W}}, y);
    else
      launch_one_token<BITS, L, G>(x, T, W, y);
  });
}

template <int BITS>
void launch_gate_up(const float* x, const WeightArgs& gate, const WeightArgs& up, float* h) {
  with_lane_layout<BITS>(gate.cols, gate.chunks_per_group_log2, scales_fit(gate) && scales_fit(up),
                         [&](auto L, auto G) { launch_mma<BITS, L, G, 1, 2>(x, 1, WeightSet<2>{{gate, up}}, h); });
}

WeightArgs weight_args(const Mat& W) {
  if (W.type != WeightType::Affine) return {static_cast<const uint8_t*>(W.data), nullptr, nullptr, W.rows, W.cols, 0};
  return {static_cast<const uint8_t*>(W.data), W.scales, W.biases, W.rows, W.cols,
          W.group >= kChunk ? floor_log2(W.group / kChunk) : 0, floor_log2(W.group), W.scale_type};
}

}  // namespace

void check_matmul_args(const float* x, const Mat& W, const float* y) {
  if (W.cols <= 0 || W.cols % kChunk != 0)
    arg_fail("cuda::matmul: cols " + std::to_string(W.cols) + " is not a positive multiple of 32");
  if (!aligned(x, 16) || !aligned(y, 16) || !aligned(W.data, 16))
    arg_fail("cuda::matmul: x, y and the weights must be 16-byte aligned");
  if (W.type != WeightType::Affine) return;
  if (W.group != 16 && W.group != 32 && W.group != 64 && W.group != 128)
    arg_fail("cuda::matmul: affine group " + std::to_string(W.group) + " is not 16, 32, 64 or 128");
  if (W.cols % W.group != 0)
    arg_fail("cuda::matmul: cols " + std::to_string(W.cols) + " not a multiple of the group " + std::to_string(W.group));
  if (W.bits < 2 || W.bits > 8 || W.bits == 7)
    arg_fail("cuda::matmul: affine bits " + std::to_string(W.bits) + " is not 2, 3, 4, 5, 6 or 8");
  if (!aligned(W.scales, scale_size(W.scale_type)) || !aligned(W.biases, scale_size(W.scale_type)))
    arg_fail("cuda::matmul: scales and biases must be aligned to their size");
}

bool tensor_core_layout(int bits, int group, ScaleType scale_type) {
  return (bits == 2 || bits == 3 || bits == 4 || bits == 8) && group >= kChunk && scale_type != ScaleType::F32;
}

void matmul_direct(const float* x, int T, const Mat& W, float* y) {
  if (T <= 0 || W.rows <= 0) return;
  check_matmul_args(x, W, y);
  const WeightArgs args = weight_args(W);
  if (W.type == WeightType::BF16) return launch_float_tokens<16>(x, T, args, y);
  if (W.type == WeightType::F32) return launch_float_tokens<32>(x, T, args, y);
  if (!tensor_core_layout(W.bits, W.group, W.scale_type))  // on the float kernel
    return with_bits<2, 3, 4, 5, 6, 8>(W.bits, "cuda::matmul", [&](auto B) { launch_float_tokens<B>(x, T, args, y); });
  with_bits<2, 3, 4, 8>(W.bits, "cuda::matmul", [&](auto B) { launch_affine<B>(x, T, args, y); });
}

void matmul(const float* x, int T, const Mat& W, float* y) {
  if (int_gemm_layout(W)) return int_matmul_pays(W, T) ? int_matmul(x, T, W, y) : matmul_direct(x, T, W, y);
  if (T >= gemm_min_tokens(W)) return matmul_gemm(x, T, W, y);
  matmul_direct(x, T, W, y);
}

bool gate_up_fuses(const Mat& gate, const Mat& up, int T) {
  return T == 1 && gate.type == WeightType::Affine && up.type == WeightType::Affine && gate.bits == up.bits &&
         gate.group == up.group && gate.rows == up.rows && gate.cols == up.cols &&
         tensor_core_layout(gate.bits, gate.group, gate.scale_type) &&
         tensor_core_layout(up.bits, up.group, up.scale_type);  // each matrix reads its own scale type
}

void gate_up_silu(const float* x, const Mat& gate, const Mat& up, float* h) {
  if (!gate_up_fuses(gate, up, 1))
    arg_fail("cuda::gate_up_silu: gate and up must be affine of one shape, bits and group (gate_up_fuses)");
  check_matmul_args(x, gate, h);
  check_matmul_args(x, up, h);
  if (gate.rows <= 0) return;
  const WeightArgs g = weight_args(gate), u = weight_args(up);
  with_bits<2, 3, 4, 8>(gate.bits, "cuda::gate_up_silu", [&](auto B) { launch_gate_up<B>(x, g, u, h); });
}

}  // namespace ms::cuda
