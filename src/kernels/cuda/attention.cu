// Causal GQA attention over the KV cache. Each (query token, head) row takes its cache positions
// in chunks of kChunk: the block's warps take kGroup positions each, loading the group's key and
// value rows at once so that their latencies overlap, and the block merges the warps into the
// chunk's softmax (its max, sum and weighted values). A block takes up to four query heads that
// share a KV head, so that each cache row is read (and decoded) once for them. The chunks are folded in position order,
// each rescaled to the running max. Where rows are few (a decode token's heads), each chunk is a
// block of its own, so that they spread over the device, and a second kernel folds them; else a
// block takes a row's chunks in turn. The chunks depend only on the row's own positions and the
// two forms fold them alike, so a token's output is the same bits whatever T is.
// Each lane holds head_dim / 32 of the query and output dims (strided by 32, so cache rows load
// coalesced). A gated layer's sigmoid(gate) multiplies the output as it is stored, instead of in
// a launch of its own. Over a cache that is not float32 (quant/kv_quant.h) the kernels' packed
// form reads each value through kv_value, decoding it where it is loaded.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kv_cache.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPerLane = 8;  // head_dim up to 256
constexpr int kGroup = 4;       // positions a warp loads at once
constexpr int kChunk = kWarps * kGroup;
// Chunks a row may take as blocks of their own: beyond this many floats of scratch a row's
// block takes its chunks in turn (the same bits).
constexpr size_t kMaxScratchFloats = size_t(16) << 20;

// A softmax over some positions: its max score m and the sum l of exp(score - m); with each
// thread's acc (Σ exp(score - m)·v at its output dim) it is a chunk's or a row's partial result.
struct Softmax {
  float m = -INFINITY, l = 0.f;
};

int chunks_of(int positions) { return (positions + kChunk - 1) / kChunk; }

__device__ __forceinline__ int row_length(int pos0, const int* pos_on_device, int t) {
  return (pos_on_device ? *pos_on_device : pos0) + t + 1;
}

// x·a + y·b, each product rounded and then their sum: written out so that no kernel contracts it
// into a fused multiply-add differently from another (the bits of both forms must agree).
__device__ __forceinline__ float mix(float x, float a, float y, float b) {
  return __fadd_rn(__fmul_rn(x, a), __fmul_rn(y, b));
}

// The running softmax `run` (and this thread's acc) takes in chunk c: both rescaled to their
// common max. The one fold of both forms, so that they give the same bits.
__device__ __forceinline__ void fold(Softmax& run, float& acc, Softmax c, float c_acc) {
  const float m = fmaxf(run.m, c.m);
  const float a = expf(run.m - m), b = expf(c.m - m);  // a is 0 at the first chunk (run.m -inf)
  run.l = mix(run.l, a, c.l, b);
  acc = mix(acc, a, c_acc, b);
  run.m = m;
}

struct AttnArgs {
  const float* q;
  const uint8_t *k, *v;
  KvSideView ks, vs;
  const float* gate;
  float* out;
  const int* pos_on_device;
  int pos0, n_heads, n_kv, hd;
  float scale;
};

// Value d of cache row `row` (position · n_kv + head) of a side: float32 read in place, or decoded.
template <bool kPacked>
__device__ __forceinline__ float cache_value(const uint8_t* base, const KvSideView& s, size_t row, int hd, int d) {
  if constexpr (kPacked) return kv_value(base, s, row, hd, d);
  return reinterpret_cast<const float*>(base)[row * hd + d];
}

// A block's shared results for H query heads (of one KV head): each warp's sums, then merged.
template <int H>
struct ChunkSmem {
  float acc[H][kWarps][kMaxPerLane * 32];
  Softmax sm[H][kWarps];
};

// Positions [lo, hi) (hi > lo) for H query heads qr of KV head kvh, by every thread of the block:
// each key and value row loaded (and decoded) once for the H heads, then each head's chunk
// softmax in all[h], and in c_acc[h] thread j's weighted value sum at output dim j (j =
// threadIdx.x < hd). A head's arithmetic is the same whatever H is: the same bits.
template <bool kPacked, int H>
__device__ void chunk_softmax(const float (&qr)[H][kMaxPerLane], const AttnArgs& a, int kvh, int lo, int hi,
                              ChunkSmem<H>& sh, Softmax (&all)[H], float (&c_acc)[H]) {
  const int hd = a.hd;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, per_lane = hd / 32;
  const int s0 = lo + warp * kGroup;
  const float scale = a.scale;
  float kr[kGroup][kMaxPerLane], vr[kGroup][kMaxPerLane];
#pragma unroll
  for (int u = 0; u < kGroup; ++u) {
    const size_t row = size_t(s0 + u) * a.n_kv + kvh;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const bool in = s0 + u < hi && i < per_lane;
      kr[u][i] = in ? cache_value<kPacked>(a.k, a.ks, row, hd, lane + i * 32) : 0.f;
      vr[u][i] = in ? cache_value<kPacked>(a.v, a.vs, row, hd, lane + i * 32) : 0.f;
    }
  }
#pragma unroll
  for (int h = 0; h < H; ++h) {
    float score[kGroup], m = -INFINITY;
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) dot = fmaf(qr[h][i], kr[u][i], dot);
      score[u] = s0 + u < hi ? warp_sum(dot) * scale : -INFINITY;  // s0 + u < hi is the same in the warp
      m = fmaxf(m, score[u]);
    }
    Softmax mine;  // a warp with no positions keeps m -inf, l 0, acc 0
    float acc[kMaxPerLane] = {};
    if (s0 < hi) {
      mine.m = m;
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        const float p = s0 + u < hi ? expf(score[u] - m) : 0.f;
        mine.l += p;
#pragma unroll
        for (int i = 0; i < kMaxPerLane; ++i) acc[i] = fmaf(p, vr[u][i], acc[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (i < per_lane) sh.acc[h][warp][i * 32 + lane] = acc[i];
    if (lane == 0) sh.sm[h][warp] = mine;
  }
  __syncthreads();

#pragma unroll
  for (int h = 0; h < H; ++h) {
    all[h] = Softmax{};
    for (int w = 0; w < kWarps; ++w) all[h].m = fmaxf(all[h].m, sh.sm[h][w].m);
    float weight[kWarps];  // of each warp's sums; 0 for a warp with no positions
    for (int w = 0; w < kWarps; ++w) {
      weight[w] = sh.sm[h][w].l > 0.f ? expf(sh.sm[h][w].m - all[h].m) : 0.f;
      all[h].l = __fadd_rn(all[h].l, __fmul_rn(sh.sm[h][w].l, weight[w]));
    }
    c_acc[h] = 0.f;
    if (int(threadIdx.x) < hd)
      for (int w = 0; w < kWarps; ++w) c_acc[h] = __fadd_rn(c_acc[h], __fmul_rn(sh.acc[h][w][threadIdx.x], weight[w]));
  }
  __syncthreads();  // before the next chunk writes sh
}

// The H query heads a block takes: block `group` of the T · n_kv · (G / H) groups is token t's
// heads h0 .. h0 + H - 1 of KV head kvh (G = n_heads / n_kv).
struct HeadGroup {
  int t, kvh, h0;
};
template <int H>
__device__ __forceinline__ HeadGroup head_group(const AttnArgs& a, int group) {
  const int G = a.n_heads / a.n_kv, per_token = a.n_kv * (G / H);
  const int t = group / per_token, rem = group % per_token, kvh = rem / (G / H);
  return {t, kvh, kvh * G + (rem % (G / H)) * H};
}

__device__ __forceinline__ void load_query(const float* qv, int hd, float (&qr)[kMaxPerLane]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) qr[i] = i < hd / 32 ? qv[i * 32 + lane] : 0.f;
}

__device__ __forceinline__ void store_row(const Softmax& run, float acc, int hd, size_t row, const float* gate,
                                          float* out) {
  if (int(threadIdx.x) >= hd) return;
  const size_t at = row * hd + threadIdx.x;
  out[at] = gate ? acc / run.l * sigmoid(gate[at]) : acc / run.l;
}


// A block per head group (head_group), its chunks in turn.
template <bool kPacked, int H>
__global__ void __launch_bounds__(kWarps * 32) attention_rows_kernel(AttnArgs a) {
  start_after_kernel_before();  // launched by launch_after
  __shared__ ChunkSmem<H> sh;
  const HeadGroup g = head_group<H>(a, blockIdx.x);
  const int len = row_length(a.pos0, a.pos_on_device, g.t);
  const size_t row0 = size_t(g.t) * a.n_heads + g.h0;
  float qr[H][kMaxPerLane];
#pragma unroll
  for (int h = 0; h < H; ++h) load_query(a.q + (row0 + h) * a.hd, a.hd, qr[h]);
  Softmax run[H];
  float acc[H] = {};
  for (int lo = 0; lo < len; lo += kChunk) {
    Softmax c[H];
    float c_acc[H];
    chunk_softmax<kPacked, H>(qr, a, g.kvh, lo, min(len, lo + kChunk), sh, c, c_acc);
#pragma unroll
    for (int h = 0; h < H; ++h) fold(run[h], acc[h], c[h], c_acc[h]);
  }
#pragma unroll
  for (int h = 0; h < H; ++h) store_row(run[h], acc[h], a.hd, row0 + h, a.gate, a.out);
}

// A block per (head group, chunk) of n_chunks a row (those past the rows' positions end at once):
// each head's chunk softmax to part and part_acc at its row, for fold_chunks_kernel.
template <bool kPacked, int H>
__global__ void __launch_bounds__(kWarps * 32) attention_chunks_kernel(AttnArgs a, int n_chunks, Softmax* part,
                                                                       float* part_acc) {
  start_after_kernel_before();  // launched by launch_after
  __shared__ ChunkSmem<H> sh;
  const HeadGroup g = head_group<H>(a, blockIdx.x / n_chunks);
  const int c = blockIdx.x % n_chunks;
  const int len = row_length(a.pos0, a.pos_on_device, g.t), lo = c * kChunk;
  if (lo >= len) return;
  const size_t row0 = size_t(g.t) * a.n_heads + g.h0;
  float qr[H][kMaxPerLane];
#pragma unroll
  for (int h = 0; h < H; ++h) load_query(a.q + (row0 + h) * a.hd, a.hd, qr[h]);
  Softmax s[H];
  float c_acc[H];
  chunk_softmax<kPacked, H>(qr, a, g.kvh, lo, min(len, lo + kChunk), sh, s, c_acc);
#pragma unroll
  for (int h = 0; h < H; ++h) {
    const size_t at = (row0 + h) * n_chunks + c;
    if (int(threadIdx.x) < a.hd) part_acc[at * a.hd + threadIdx.x] = c_acc[h];
    if (threadIdx.x == 0) part[at] = s[h];
  }
}

// A block per row: its chunks' results folded in order, as attention_rows_kernel folds them.
__global__ void __launch_bounds__(kWarps * 32) fold_chunks_kernel(AttnArgs a, int n_chunks, const Softmax* part,
                                                                  const float* part_acc) {
  start_after_kernel_before();  // launched by launch_after
  const int row = blockIdx.x;
  const int len = row_length(a.pos0, a.pos_on_device, row / a.n_heads);
  Softmax run;
  float acc = 0.f;
  for (int c = 0; c < n_chunks && c * kChunk < len; ++c) {
    const size_t at = size_t(row) * n_chunks + c;
    fold(run, acc, part[at], int(threadIdx.x) < a.hd ? part_acc[at * a.hd + threadIdx.x] : 0.f);
  }
  store_row(run, acc, a.hd, size_t(row), a.gate, a.out);
}

// Whether the rows' chunks run as blocks of their own (and how many a row): where rows are fewer
// than the multiprocessors and their scratch stays within kMaxScratchFloats.
int chunk_blocks(int rows, int positions, int hd) {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  const int n = chunks_of(positions);
  if (rows >= sms || n < 2 || size_t(rows) * size_t(n) * size_t(hd + 2) > kMaxScratchFloats) return 0;
  return n;
}

}  // namespace

size_t attention_scratch_floats(int T, int n_heads, int hd, int positions) {
  static_assert(sizeof(Softmax) == 2 * sizeof(float));
  const int rows = T * n_heads, n = rows > 0 ? chunk_blocks(rows, positions, hd) : 0;
  return size_t(rows) * size_t(n) * size_t(hd + 2);
}

void attention(const float* q, const float* k, const float* v, int T, int pos0, int n_heads, int n_kv, int hd,
               float* out, float* scratch, int positions, const int* pos_on_device, const float* gate) {
  const KvSideView f32 = kv_side_view(KvSide{}, hd);
  attention(q, KvRowsView{reinterpret_cast<const uint8_t*>(k), f32}, KvRowsView{reinterpret_cast<const uint8_t*>(v), f32},
            T, pos0, n_heads, n_kv, hd, out, scratch, positions, pos_on_device, gate);
}

void attention(const float* q, KvRowsView k, KvRowsView v, int T, int pos0, int n_heads, int n_kv, int hd, float* out,
               float* scratch, int positions, const int* pos_on_device, const float* gate) {
  if (hd <= 0 || hd % 32 != 0 || hd > kMaxPerLane * 32)
    arg_fail("cuda::attention: head_dim " + std::to_string(hd) + " is not a multiple of 32 up to 256");
  if (n_kv <= 0 || n_heads % n_kv != 0)
    arg_fail("cuda::attention: n_heads " + std::to_string(n_heads) + " is not a multiple of n_kv " +
             std::to_string(n_kv));
  if (T <= 0) return;
  if (positions < (pos_on_device ? 1 : pos0 + T))
    arg_fail("cuda::attention: positions " + std::to_string(positions) + " is less than pos0 + T = " +
             std::to_string(pos0 + T));
  const AttnArgs a{q, k.data, v.data, k.side, v.side, gate, out, pos_on_device, pos0, n_heads, n_kv, hd,
                   1.0f / std::sqrt(float(hd))};
  const bool packed = k.side.bits != 32 || v.side.bits != 32;
  const int G = n_heads / n_kv, H = G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;  // query heads a block takes
  const unsigned groups = unsigned(T * n_heads / H);
  const int rows = T * n_heads, n = chunk_blocks(rows, positions, hd);
  if (n == 0) {
    using Kernel = void (*)(AttnArgs);
    const Kernel kernels[2][3] = {{attention_rows_kernel<false, 1>, attention_rows_kernel<false, 2>, attention_rows_kernel<false, 4>},
                                  {attention_rows_kernel<true, 1>, attention_rows_kernel<true, 2>, attention_rows_kernel<true, 4>}};
    launch_after(kernels[packed][H / 2], groups, kWarps * 32, 0, a);
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (!scratch || !aligned(scratch, 8))
    arg_fail("cuda::attention: " + std::to_string(rows) + " rows need scratch of attention_scratch_floats, 8-byte aligned");
  auto* part = reinterpret_cast<Softmax*>(scratch);
  float* part_acc = scratch + 2 * size_t(rows) * size_t(n);
  using Kernel = void (*)(AttnArgs, int, Softmax*, float*);
  const Kernel kernels[2][3] = {{attention_chunks_kernel<false, 1>, attention_chunks_kernel<false, 2>, attention_chunks_kernel<false, 4>},
                                {attention_chunks_kernel<true, 1>, attention_chunks_kernel<true, 2>, attention_chunks_kernel<true, 4>}};
  launch_after(kernels[packed][H / 2], groups * unsigned(n), kWarps * 32, 0, a, n, part, part_acc);
  CUDA_CHECK_LAUNCH();
  launch_after(fold_chunks_kernel, unsigned(rows), kWarps * 32, 0, a, n, static_cast<const Softmax*>(part),
               static_cast<const float*>(part_acc));
  CUDA_CHECK_LAUNCH();
}

}  // namespace ms::cuda
