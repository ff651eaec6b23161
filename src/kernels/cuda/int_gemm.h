#pragma once
// Prefill products on the integer tensor cores, as kernels/int_dot.h defines them: the same bits
// as cpu::int_matmul, on every device. x is split once into the four signed bytes of its 30-bit
// integers; a warp then multiplies a tile of rows by a tile of tokens (mma.m16n8k32, codes ×
// bytes, int32), each weight read once per tile of tokens, and every output is summed unit by
// unit in one lane, in the order int_dot.h gives. Dense matrices take int_matmul; a MoE layer's
// routed experts take int_experts, every expert over its own tokens in one launch for gate and
// up and one for down. Plain C++: no CUDA headers needed to include this.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/ops.h"
#include "kernels/weights.h"

namespace ms::cuda {

// A MoE layer's experts take the integer GEMM from this many tokens on, where the layout allows;
// fewer (a decode step, an MTP verify) keep the decode kernels.
inline constexpr int kIntGemmMinTokens = 16;
// cuda::matmul takes it for a dense product from kIntMatmulMinTokens tokens and rows × tokens of
// kIntMatmulMinWork on: below, too few warps share the rows and the decode kernels finish first
// (docs/PERFORMANCE.md, H100).
inline constexpr int kIntMatmulMinTokens = 64;
inline constexpr int64_t kIntMatmulMinWork = int64_t(1) << 19;

// Whether int_matmul takes W: affine 4 or 8 bits, groups of 32 to 128, bf16 or f16 scales.
bool int_gemm_layout(const Mat& W);
// Whether cuda::matmul takes int_matmul for W over T tokens.
bool int_matmul_pays(const Mat& W, int T);

// A warp's tile, 16·mt rows by 8·nt tokens (1×4, 1×2, 2×2 or 4×2), and whether a unit's loads
// all issue before its MMAs. The bits do not depend on it; benchmarks compare them.
struct IntGemmTiles {
  int mt = 1, nt = 4;
  bool unroll = false;
};
// Dense products: 16 rows by 32 tokens a warp. Experts: 16 rows by 16 tokens (an expert of a
// 512-token chunk of a 512-expert top-10 model has about ten), 32 by 16 where they average
// kWideExpertUsers users or more. A unit's loads together in each (measured, docs/PERFORMANCE.md).
inline constexpr IntGemmTiles kDenseTiles{1, 4, true}, kExpertTiles{1, 2, true}, kWideExpertTiles{2, 2, true};
inline constexpr int kWideExpertUsers = 24;

// y [T, W.rows] = x [T, W.cols] · Wᵀ (device pointers, 16-byte aligned), int_dot.h's bits.
void int_matmul(const float* x, int T, const Mat& W, float* y);
void int_matmul(const float* x, int T, const Mat& W, float* y, IntGemmTiles tiles);

// One matrix of one expert in VRAM (int_gemm_layout's layouts; the shape and layout in the
// IntExperts).
struct IntExpertMat {
  const uint8_t* q;
  const uint16_t* scales;
  const uint16_t* biases;
};

// Some of a MoE layer's routed experts over their users (token·K + slot pairs): expert i's users
// are entries [begin[i], end[i]) of the layer's arrays of users_total.
struct IntExperts {
  int n = 0;                             // experts
  const IntExpertMat *gate, *up, *down;  // host arrays [n], device pointers in them
  Mat gate_layout, down_layout;          // shapes and layouts (data unused): gate = up [I, H], down [H, I]
  const size_t *begin, *end;             // host [n]
  int users_total = 0;
  const int* token_rows;  // device [users_total]: the row of x of each user
  const int* users;       // device [users_total]: token·K + slot, the row of `partial` it writes
  const float* weights;   // device [users_total]: the routing weight of each user
};

// Whether int_experts takes experts of these layouts (gate and up alike, every one int_gemm_layout).
bool int_experts_layout(const Mat& gate, const Mat& up, const Mat& down);

// partial[users[j]] = weights[j] · down(silu(gate·x) · (up·x)) for each user j of each expert, x
// [T, H] the token rows; the rows of `partial` ([T·K, H]) no user names are left as they are.
void int_experts(const IntExperts& e, const float* x, int T, float* partial);
void int_experts(const IntExperts& e, const float* x, int T, float* partial, IntGemmTiles tiles);

// A decode token's routed experts straight from their records, in int_experts' bits (and so
// cpu::int_expert's): slot k of K runs the record at records[k] (a device array; a null entry is
// skipped, its row of partial left as it is, for an expert computed elsewhere) and writes
// partial[k] = weights[k] · down(silu(gate·x) · (up·x)), x [H]. Nothing comes from the host: a
// step's graph may hold it. scratch: int_records_scratch_bytes(K, proj), 16-byte aligned.
bool int_records_layout(const RecordMat (&proj)[3]);
size_t int_records_scratch_bytes(int K, const RecordMat (&proj)[3]);
void int_expert_records(const float* x, int K, const uint8_t* const* records, const float* weights,
                        const RecordMat (&proj)[3], float* partial, void* scratch);

}  // namespace ms::cuda
