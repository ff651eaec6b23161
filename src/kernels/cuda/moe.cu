// The MoE block's routing and routed experts on the GPU, for decode-sized batches: no host round
// trip and a few launches in all. route_topk: one block per token. moe_experts: gate·x and up·x
// of every (token, slot) row in one launch (silu·up fused), then down and the weighted sum over
// the slots in a second (moe_down). moe_gate_up_routed: that first launch for a decode token
// whose blocks each route it themselves, so that the routing is no launch of its own. Affine
// experts of a tensor_core_layout go to the integer tensor cores (mma_dot.cuh, as cuda::matmul's
// affine rows), bf16 ones and the other affine layouts to weight_dot.cuh's float kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/mma_dot.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/weight_dot.cuh"

namespace ms::cuda {
namespace {

constexpr int kRouteThreads = 256;
constexpr int kMaxExperts = 8192;    // probabilities and taken flags of a row in 48 KB of shared memory
constexpr int kWarpTopSlots = 16;    // experts a lane holds in warp_route_top_k
constexpr int kGateUpThreads = 128;  // small blocks: more of them over the few rows of an expert
constexpr int kDownThreads = 256;
constexpr int kGateUpMmaWarps = 8;
// A block's (slot, lane block) items in one round: 20 at Qwen3-Next-80B's shape, 24 at Qwen3-30B's.
constexpr int kDownMmaWarps = 24;

// Rows of at most this many experts take route_kernel's top-k in one warp's registers.
constexpr int kWarpTopExperts = 32 * kWarpTopSlots;

// A probability's rank as an int: its bits where it is a number (p >= 0, so the bits order as the
// values do), below every number for a NaN (never picked, as block_top_k) and for the taken (-1).
__device__ __forceinline__ int rank_key(float v) { return isnan(v) ? -2 : __float_as_int(v); }

// A tournament round over the first N of a lane's keys and their slots: the better of each pair
// into the pair's first place, the left (the lower slot) where they tie.
template <int N>
__device__ __forceinline__ void keep_better_halves(int (&k)[kWarpTopSlots], int (&s)[kWarpTopSlots]) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const bool right = k[2 * i + 1] > k[2 * i];
    k[i] = right ? k[2 * i + 1] : k[2 * i];
    s[i] = right ? s[2 * i + 1] : s[2 * i];
  }
}

// The best of a lane's keys (the lowest slot among equals) and its slot, as a tournament: four
// levels of compares rather than a chain of sixteen, on the path of every round of the top-k.
__device__ __forceinline__ void lane_best(const int (&key)[kWarpTopSlots], int& best, int& slot) {
  static_assert(kWarpTopSlots == 16, "four levels");
  int k[kWarpTopSlots], s[kWarpTopSlots];
#pragma unroll
  for (int i = 0; i < kWarpTopSlots; ++i) k[i] = key[i], s[i] = i;
  keep_better_halves<16>(k, s);
  keep_better_halves<8>(k, s);
  keep_better_halves<4>(k, s);
  keep_better_halves<2>(k, s);
  best = k[0], slot = s[0];
}

// Keys ranked in one pass rather than in rounds: at most this many may reach or pass the threshold.
constexpr int kMaxCandidates = 64;

// The top k by rounds: a round is a warp max of the lanes' bests and a warp min of the indices
// that hold it (ties to the lower index, as cpu::top_k); only the winning lane rescans its keys.
// Round r's index and value go to lane r (an index of INT_MAX and -inf where only NaNs are left,
// as block_top_k).
__device__ __forceinline__ void top_k_by_rounds(int (&key)[kWarpTopSlots], int best, int slot, int K, int& mine,
                                                float& picked) {
  const int lane = threadIdx.x & 31;
  for (int round = 0; round < K; ++round) {
    const int top = __reduce_max_sync(0xffffffffu, best);
    const unsigned at = __reduce_min_sync(0xffffffffu, best == top ? unsigned(32 * slot + lane) : UINT_MAX);
    if (round == lane) picked = top >= 0 ? __int_as_float(top) : -INFINITY, mine = top >= 0 ? int(at) : INT_MAX;
    const bool won = top >= 0 && int(at % 32) == lane;  // every lane rescans, the winner's keys changed
#pragma unroll
    for (int s = 0; s < kWarpTopSlots; ++s)
      if (won && s == int(at / 32)) key[s] = -1;
    lane_best(key, best, slot);
  }
}

// The k-th best of the lanes' bests (ties to the lower lane), k <= 32: a threshold no key of the
// top k is below, since k lanes hold a key at least as good.
__device__ __forceinline__ int kth_lane_best(int best, int k) {
  const int lane = threadIdx.x & 31;
  int rank = 0;
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int other = __shfl_sync(0xffffffffu, best, l);
    rank += other > best || (other == best && l < lane);
  }
  return __shfl_sync(0xffffffffu, best, __ffs(__ballot_sync(0xffffffffu, rank == k - 1)) - 1);
}

// route_row's top-k, weights and records, by the block's first warp; lane l holds p[l + 32s] in
// registers. The keys at or past kth_lane_best (and numbers: not below 0) are listed in `listed`
// [kMaxCandidates] and each is ranked against the others (ties to the lower index, as
// cpu::top_k): faster than top_k_by_rounds' k rounds, and still the longest part of the routing
// (docs/PERFORMANCE.md#cuda-routing-and-experts). Rows where more keys reach the
// threshold (ties: equal logits) take the rounds. Either way round r's pick goes to lane r, and
// where fewer than K keys are numbers the rest are INT_MAX and -inf, as block_top_k's. picks: [32]
// in shared memory. tab: the table's entries in shared memory (where table is given).
__device__ void warp_route_top_k(const float (&pv)[kWarpTopSlots], int E, int K, bool norm_topk, int* id, float* w,
                                 const uint8_t* const* tab, const uint8_t** rec, int2* listed, int2* picks) {
  const int lane = threadIdx.x & 31;
  int key[kWarpTopSlots];
#pragma unroll
  for (int s = 0; s < kWarpTopSlots; ++s) key[s] = lane + 32 * s < E ? rank_key(pv[s]) : -2;
  int best, slot;
  lane_best(key, best, slot);
  const int threshold = max(kth_lane_best(best, K), 0);
  int n = 0;
#pragma unroll
  for (int s = 0; s < kWarpTopSlots; ++s) n += key[s] >= threshold;
  int first = n;  // an inclusive scan of n over the lanes, then exclusive
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int below = __shfl_up_sync(0xffffffffu, first, d);
    if (lane >= d) first += below;
  }
  const int listed_n = __shfl_sync(0xffffffffu, first, 31);
  first -= n;
  int mine = INT_MAX;
  float picked = -INFINITY;
  if (listed_n <= kMaxCandidates) {
#pragma unroll
    for (int s = 0; s < kWarpTopSlots; ++s)
      if (key[s] >= threshold) listed[first++] = make_int2(key[s], lane + 32 * s);
    __syncwarp();
    for (int c = lane; c < listed_n; c += 32) {
      const int2 me = listed[c];
      int rank = 0;
      for (int o = 0; o < listed_n; ++o) {
        const int2 other = listed[o];
        rank += other.x > me.x || (other.x == me.x && other.y < me.y);
      }
      if (rank < K) picks[rank] = me;
    }
    __syncwarp();
    if (lane < min(listed_n, K)) mine = picks[lane].y, picked = __int_as_float(picks[lane].x);
  } else {
    top_k_by_rounds(key, best, slot, K, mine, picked);
  }
  float sum = 0.f;  // in round order, as block_top_k's
  for (int k = 0; k < K; ++k) sum += __shfl_sync(0xffffffffu, picked, k);
  if (lane >= K) return;
  id[lane] = mine;
  w[lane] = norm_topk ? picked / sum : picked;
  if (tab) rec[lane] = mine < E ? tab[mine] : nullptr;
}

// Shared memory route_row takes for E experts: the exponentials [E] and the warps' maxima, then
// (8-byte aligned) the listed keys [kMaxCandidates] and picks [32] of warp_route_top_k, then the
// table's entries [E].
__host__ __device__ inline size_t route_row_listed_at(int E, int warps) { return size_t(E + warps + 1) / 2 * 2; }
__host__ __device__ inline size_t route_row_floats(int E, int warps) {
  return route_row_listed_at(E, warps) + 2 * size_t(kMaxCandidates + 32);
}
__host__ __device__ inline size_t route_row_bytes(int E, int warps) {
  return route_row_floats(E, warps) * sizeof(float) + size_t(E) * sizeof(const uint8_t*);
}

// Lane l's sum of p[l], p[l + 32], ... in turn, then warp_sum's: cpu::warp_order_sum's order, so
// that the probabilities are cpu::softmax's bits (route_softmax).
__device__ __forceinline__ float warp_order_total(const float* p, int E) {
  float part = 0.f;
  for (int i = int(threadIdx.x & 31); i < E; i += 32) part += p[i];
  return warp_sum(part);
}

// a / b as IEEE float division rounds it, given inverse = 1.0 / double(b), for finite a >= 0 and
// b >= 1 (an exponential over the sum it is part of): one double multiply and two conversions,
// where float division is a reciprocal, its refinement and a check for its slow path. It is exact:
// the product is within 2^-52 of a / b relative to it, and a quotient of floats is never a
// midpoint between two floats nor nearer one than 2^-49 relative (a - b·m is a nonzero multiple of
// the coarser of the two grids), so that both round to the same float. No a, b of 2.4e9 tried
// on the host (random, and every float of six binades over 40 divisors) told them apart.
__device__ __forceinline__ float quotient(float a, double inverse) { return float(double(a) * inverse); }

// The routing of one row of E <= kWarpTopExperts logits, K <= 32, by a block of THREADS: route_softmax's
// probabilities (the same bits) and warp_route_top_k's picks, in three barriers rather than the
// six of route_softmax and the top-k after it. Every thread reads its logits and its entries of the
// table at once and takes the block's maximum from the warps' maxima; warp 0 sums the
// exponentials, divides its own values in its registers (quotient) and takes the top k of them,
// while the other warps run meanwhile(thread) (their thread's index from 0): gate_up_mma_kernel
// stages x there (docs/PERFORMANCE.md#cuda-routing-and-experts).
// Writes id, w and rec [K] (from warp 0) and probs [E] where given; every thread of the block
// calls it, and it ends with a barrier.
template <int THREADS, class Meanwhile>
__device__ void route_row(const float* logits, int E, int K, bool norm_topk, float* probs, int* id, float* w,
                          const uint8_t* const* table, const uint8_t** rec, float* smem, Meanwhile&& meanwhile) {
  constexpr int kWarps = THREADS / 32, kPer = kWarpTopExperts / THREADS;
  static_assert(kWarpTopExperts % THREADS == 0, "a whole number of logits a thread");
  float* e = smem;
  float* warp_max_of = smem + E;
  int2* listed = reinterpret_cast<int2*>(smem + route_row_listed_at(E, kWarps));
  const uint8_t** tab = reinterpret_cast<const uint8_t**>(smem + route_row_floats(E, kWarps));
  const int tid = threadIdx.x, lane = tid & 31;
  float v[kPer];
  const uint8_t* t[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {  // every load issued before any store waits for one
    const int i = tid + j * THREADS;
    v[j] = i < E ? logits[i] : -INFINITY;
    t[j] = table && i < E ? table[i] : nullptr;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (table && tid + j * THREADS < E) tab[tid + j * THREADS] = t[j];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPer; ++j) mx = fmaxf(mx, v[j]);
  mx = warp_max(mx);
  if (lane == 0) warp_max_of[tid >> 5] = mx;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kWarps; ++k) mx = fmaxf(mx, warp_max_of[k]);
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (tid + j * THREADS < E) e[tid + j * THREADS] = float(exp(double(v[j] - mx)));
  __syncthreads();
  if (tid < 32) {
    const double inverse = 1.0 / double(warp_order_total(e, E));
    float pv[kWarpTopSlots];
#pragma unroll
    for (int k = 0; k < kWarpTopSlots; ++k) {
      const int i = lane + 32 * k;
      pv[k] = i < E ? quotient(e[i], inverse) : 0.f;
      if (probs && i < E) probs[i] = pv[k];
    }
    warp_route_top_k(pv, E, K, norm_topk, id, w, table ? tab : nullptr, rec, listed, listed + kMaxCandidates);
  } else {
    meanwhile(tid - 32);
  }
  __syncthreads();
}

// The softmax of one row of logits x [E] into p (shared memory) and, where given, probs, by a
// block of THREADS. The exponentials are rounded once from double (as a correctly rounded expf)
// and summed in cpu::warp_order_sum's order, so that the probabilities are cpu::softmax's bit for
// bit wherever the host's expf rounds correctly (all but a few values in ten thousand with glibc)
// and near-ties break as on the CPU. That order's sum is a warp's 16 adds a lane and 5 shuffles at
// 512 experts, against 512 adds in turn for index order
// (docs/PERFORMANCE.md#cuda-routing-and-experts).
// Every value is computed alone and the sum is warp 0's, so the bits do not depend on THREADS.
template <int THREADS>
__device__ void route_softmax(const float* x, int E, float* p, float* probs) {
  __shared__ float total;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < E; i += THREADS) mx = fmaxf(mx, x[i]);
  mx = block_reduce<THREADS, true>(mx);
  for (int i = threadIdx.x; i < E; i += THREADS) p[i] = float(exp(double(x[i] - mx)));
  __syncthreads();
  if (threadIdx.x < 32) {
    const float t = warp_order_total(p, E);
    if (threadIdx.x == 0) total = t;
  }
  __syncthreads();
  const float sum = total;
  for (int i = threadIdx.x; i < E; i += THREADS) {
    p[i] = p[i] / sum;
    if (probs) probs[i] = p[i];
  }
  __syncthreads();
}

// Whether a row of E experts, top K, goes to route_row (else route_softmax and block_top_k).
__host__ __device__ inline bool routes_in_warp(int E, int K) { return E <= kWarpTopExperts && K <= 32; }

// softmax, top-k and the picked weights of one row of logits, a block per row (route_row, or
// route_softmax and block_top_k). smem: route_kernel_bytes.
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const float* logits, int E, int K, bool norm_topk,
                                                              float* probs, int* ids, float* weights,
                                                              const uint8_t* const* table, const uint8_t** records) {
  start_after_kernel_before();  // launched by launch_after
  extern __shared__ __align__(16) float p[];  // route_row's, or [E] then taken flags [E]
  int* id = ids + size_t(blockIdx.x) * K;
  float* w = weights + size_t(blockIdx.x) * K;
  const uint8_t** rec = table ? records + size_t(blockIdx.x) * K : nullptr;
  const float* row = logits + size_t(blockIdx.x) * E;
  if (routes_in_warp(E, K)) {
    route_row<kRouteThreads>(row, E, K, norm_topk, probs + size_t(blockIdx.x) * E, id, w, table, rec, p, [](int) {});
    return;
  }
  unsigned char* taken = reinterpret_cast<unsigned char*>(p + E);
  route_softmax<kRouteThreads>(row, E, p, probs + size_t(blockIdx.x) * E);
  // Every thread sums the picked probabilities in round order (the same sum in each), and the
  // thread of a round writes its id, weight and record: no thread reads back what another wrote.
  // Thread k < kRouteThreads keeps round k's pick and reads its record after the rounds: read
  // within them, each read's latency held up the next round's barrier.
  float picked = 0.f, s = 0.f;
  int mine = -1;
  block_top_k<kRouteThreads>(p, E, K, taken, [&](int round, int i, float v) {
    s += v;
    if (round % kRouteThreads != int(threadIdx.x)) return;
    id[round] = i, w[round] = v;
    if (round == int(threadIdx.x)) picked = v, mine = i;
    else if (table) rec[round] = table[i];
  });
  if (table && mine >= 0) rec[threadIdx.x] = table[mine];
  if (!norm_topk) return;
  if (int(threadIdx.x) < K) w[threadIdx.x] = picked / s;
  for (int k = int(threadIdx.x) + kRouteThreads; k < K; k += kRouteThreads) w[k] /= s;  // past a round each thread
}

size_t route_kernel_bytes(int E, int K) {
  return routes_in_warp(E, K) ? route_row_bytes(E, kRouteThreads / 32) : size_t(E) * (sizeof(float) + 1);
}

// Shared memory route_in_block takes for E experts, top K, in a block of `warps` warps: route_row's,
// then the records, ids and weights [K] (8-byte aligned).
inline size_t route_in_block_bytes(int E, int K, int warps) {
  return route_row_bytes(E, warps) + size_t(K) * (sizeof(const uint8_t*) + sizeof(int) + sizeof(float));
}

// route_kernel's routing of one token (route_row's: a table, E <= kWarpTopExperts, K <= 32) by a
// block of THREADS that then runs slot j's expert, and meanwhile(thread) on the warps
// after the first (route_row): every such block routes the token for itself, the same bits, and
// block (0, 0) writes what route_topk would. Returns slot j's record. smem: route_in_block_bytes.
template <int THREADS, class Meanwhile>
__device__ const uint8_t* route_in_block(const InlineRoute& r, int K, int j, float* smem, Meanwhile&& meanwhile) {
  const uint8_t** rec = reinterpret_cast<const uint8_t**>(smem + route_row_bytes(r.E, THREADS / 32) / sizeof(float));
  int* id = reinterpret_cast<int*>(rec + K);
  float* w = reinterpret_cast<float*>(id + K);
  const bool writes = blockIdx.x == 0 && blockIdx.y == 0;
  route_row<THREADS>(r.logits, r.E, K, r.norm_topk, writes ? r.probs : nullptr, id, w, r.table, rec, smem, meanwhile);
  if (const int k = threadIdx.x; writes && k < K) r.ids[k] = id[k], r.weights[k] = w[k], r.records[k] = rec[k];
  return rec[j];
}

// The shared expert's gated output the down kernels add to out where s is given:
// out[t] += sigmoid(logit[t]) · s[t] (cuda::shared_gate_add's formula).
struct SharedTerm {
  const float* s;      // [T, H]
  const float* logit;  // [T]: the shared expert gate's logit of each token
};

// The shared term of out[t][row]: its gate's logit and value, which a kernel may load ahead, where it has
// nothing else in flight rather than after its last sum.
struct SharedValue {
  float logit = 0.f, s = 0.f;  // the gate's sigmoid taken in plus: no wait on the loads before then
  __device__ __forceinline__ void load(const SharedTerm& sh, int t, int H, int row) {
    if (sh.s) logit = sh.logit[t], s = sh.s[size_t(t) * H + row];
  }
  __device__ __forceinline__ float plus(float o, const SharedTerm& sh) const { return sh.s ? o + sigmoid(logit) * s : o; }
};

// o plus the shared term of out[t][row], loaded now.
__device__ __forceinline__ float plus_shared(float o, const SharedTerm& sh, int t, int H, int row) {
  SharedValue v;
  v.load(sh, t, H, row);
  return v.plus(o, sh);
}

// A projection's place in a record, as the kernels take it.
struct ProjArgs {
  size_t q, scales, biases;
  int rows, cols, chunks_per_group_log2, group_log2;
  ScaleType scale_type;
};

__device__ __forceinline__ WeightArgs weights_of(const uint8_t* record, const ProjArgs& p) {
  return {record + p.q, reinterpret_cast<const uint16_t*>(record + p.scales),
          reinterpret_cast<const uint16_t*>(record + p.biases), p.rows, p.cols, p.chunks_per_group_log2,
          p.group_log2, p.scale_type};
}

// Block (set, j): rows of set `set` of gate and up of record j on x[j / K], and
// h[j] = silu(gate·x) · (up·x) for them (cuda::silu_mul's formula). BITS: 16 for bf16 rows, else
// affine ones of that width, in float (dot_rows_of).
template <int BITS>
__global__ void __launch_bounds__(kGateUpThreads) gate_up_float_kernel(const float* __restrict__ x, int K,
                                                                       const uint8_t* const* records, ProjArgs gate,
                                                                       ProjArgs up, float* __restrict__ h,
                                                                       int split_log2) {
  constexpr int R = kFloatRows;
  extern __shared__ float4 xs[];  // [H/32][kChunkSlots]
  const int H = gate.cols, I = gate.rows, j = blockIdx.y;
  stage_activations<kGateUpThreads>(x + size_t(j / K) * H, 1, 1, H, xs);

  const uint8_t* record = records[j];
  const WeightArgs W[2] = {weights_of(record, gate), weights_of(record, up)};
  const int split = 1 << split_log2, lane = threadIdx.x & (split - 1), grp = threadIdx.x >> split_log2;
  const int groups = kGateUpThreads >> split_log2;
  const int nsets = (I + groups * R - 1) / (groups * R);
  for (int set = blockIdx.x; set < nsets; set += gridDim.x) {  // uniform over the block
    const int r0 = (set * groups + grp) * R;
    float acc[2][R][1] = {};
    dot_rows_of<BITS, 1, 2>(xs, W, r0, lane, split, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float g = sum_lanes(acc[0][r][0], split), u = sum_lanes(acc[1][r][0], split);
      if (lane == 0 && r0 + r < I) h[size_t(j) * I + size_t(r0 + r)] = g / (1.0f + expf(-g)) * u;
    }
  }
}

// Block (b, t): rows [b·quads·R, (b+1)·quads·R) of out[t]. The K rows h[t·K + k] are staged
// together; the groups take the (quad of rows, slot) items, and once all are done each row is
// summed over the slots in k order: out = Σ_k fl(w_k · y_k), as scatter_scaled then sum_slots.
// BITS as gate_up_float_kernel's.
template <int BITS>
__global__ void __launch_bounds__(kDownThreads) down_sum_float_kernel(const float* __restrict__ h, int K,
                                                                      const uint8_t* const* records,
                                                                      const float* __restrict__ weights, ProjArgs down,
                                                                      int quads, SharedTerm shared,
                                                                      float* __restrict__ out, int split_log2) {
  constexpr int R = kFloatRows;
  extern __shared__ float4 xs[];  // [K][nchunks][kChunkSlots], then ys
  const int I = down.cols, H = down.rows, nchunks = I / kChunk, t = blockIdx.y;
  const int block_rows = quads * R, row0 = blockIdx.x * block_rows;
  float* ys = reinterpret_cast<float*>(xs + size_t(K) * nchunks * kChunkSlots);  // [K][block_rows]
  stage_activations<kDownThreads>(h + size_t(t) * K * I, K, K, I, xs);

  const int split = 1 << split_log2, lane = threadIdx.x & (split - 1), grp = threadIdx.x >> split_log2;
  const int groups = kDownThreads >> split_log2;
  const int items = quads * K;
  // Rounds of `groups` items, the same number for every lane (the shuffles need whole warps):
  // a group past the end recomputes the last item and does not store it.
  for (int base = 0; base < items; base += groups) {
    const int item = min(base + grp, items - 1), k = item % K, q = item / K;
    const WeightArgs W[1] = {weights_of(records[size_t(t) * K + k], down)};
    float acc[1][R][1] = {};
    dot_rows_of<BITS, 1, 1>(xs + size_t(k) * nchunks * kChunkSlots, W, row0 + q * R, lane, split, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float y = sum_lanes(acc[0][r][0], split);
      if (lane == 0 && base + grp < items) ys[k * block_rows + q * R + r] = y;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < block_rows && row0 + i < H; i += kDownThreads) {
    float o = 0.f;
    for (int k = 0; k < K; ++k) o = __fadd_rn(o, __fmul_rn(weights[size_t(t) * K + k], ys[k * block_rows + i]));
    out[size_t(t) * H + size_t(row0 + i)] = plus_shared(o, shared, t, H, row0 + i);
  }
}

// gate and up of record j = blockIdx.y on x[j / K] on the tensor cores, both loaded together
// (mma_row_sets over the row sets blockIdx.x, ...), and h[j] = silu(gate·x) · (up·x) for them.
// Launched overlapped, as down_mma_kernel: only the launch overlaps the kernel before, because the
// records may be what it wrote (route_topk), so the kernel waits before it reads anything.
// ROUTED: the records are not given; each block routes the token first (route_in_block, T = 1).
template <int BITS, int L, int G, bool ROUTED>
__global__ void __launch_bounds__(kGateUpMmaWarps * 32, 2) gate_up_mma_kernel(const float* __restrict__ x, int K,
                                                                         const uint8_t* const* records, ProjArgs gate,
                                                                         ProjArgs up, float* __restrict__ h,
                                                                         int ks_log2, InlineRoute route) {
  extern __shared__ __align__(16) uint2 smem[];
  constexpr int U = kBlocksAtOnce<BITS, L>;
  const int H = gate.cols, I = gate.rows, j = blockIdx.y;
  // rest: partial sums [kGateUpMmaWarps][2][16], then route_in_block's
  constexpr int kThreads = kGateUpMmaWarps * 32;
  const SplitSmem s = split_smem<L>(smem, 1, H);
  const float* xj = x + size_t(j / K) * H;
  grid_dependency_wait();
  const uint8_t* record = nullptr;
  if constexpr (ROUTED) {
    // x stages while the first warp picks the experts.
    record = route_in_block<kThreads>(route, K, j, s.rest + kGateUpMmaWarps * 2 * 16, [&](int tid) {
      stage_split_part<BITS, L, G, kThreads - 32>(tid, xj, 1, 1, H, s.xb, s.pow2, s.xsum);
    });
  } else {
    record = records[j];
  }
  const WeightArgs W[2] = {weights_of(record, gate), weights_of(record, up)};
  if constexpr (!ROUTED) {
    const int2 blocks = warp_blocks(s.nquads / L, ks_log2, int(threadIdx.x >> 5));
    const int r0 = tile_row0<kGateUpMmaWarps>(blockIdx.x, ks_log2);
#pragma unroll
    for (int m = 0; m < 2; ++m) prefetch_rows<BITS, L, U>(W[m], r0, blocks.x, blocks.y);
    stage_split<BITS, L, G, kThreads>(xj, 1, 1, H, s.xb, s.pow2, s.xsum);
  }
  mma_row_sets<BITS, L, G, U, 1, 2, kGateUpMmaWarps>(StagedX{s.xb, s.pow2, s.xsum, s.nquads, 1, 0}, W, ks_log2, s.rest,
                                                     [&](int row, int, const float (&v)[2]) {
                                                       h[size_t(j) * I + row] = v[0] / (1.0f + expf(-v[0])) * v[1];
                                                     });
  grid_dependents_may_start();
}

// Block (b, t): rows [16b, 16b + 16) of out[t] on the tensor cores. The K rows h[t·K + k] are
// staged together as K tokens; the warps take the (slot, lane block) items, and once all are done
// each row is summed over the slots in k order: out = Σ_k fl(w_k · y_k), as down_sum_float_kernel.
// Nothing is asked of the L2 ahead: the addresses would need the routed records first, whose load
// then held up the staging's. The products w_k · y_k are formed by a thread each and the shared
// gate's sigmoid is taken last (docs/PERFORMANCE.md#cuda-routing-and-experts).
template <int BITS, int L, int G>
__global__ void __launch_bounds__(kDownMmaWarps * 32) down_mma_kernel(const float* __restrict__ h, int K,
                                                                    const uint8_t* const* records,
                                                                    const float* __restrict__ weights, ProjArgs down,
                                                                    SharedTerm shared, float* __restrict__ out) {
  extern __shared__ __align__(16) uint2 smem[];
  const int I = down.cols, H = down.rows, t = blockIdx.y, r0 = blockIdx.x * 16;
  const SplitSmem s = split_smem<L>(smem, K, I);
  const int nblocks = s.nquads / L, items = K * nblocks;
  float* partial = s.rest;                      // [K][nblocks][16]
  float* slot_weights = partial + items * 16;  // [K]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  auto weights_k = [&](int k) { return weights_of(records[size_t(t) * K + k], down); };
  grid_dependency_wait();
  // The slots' weights and the shared term, read while x stages rather than after the last sum,
  // off the critical path (docs/PERFORMANCE.md#cuda-routing-and-experts).
  const int i = threadIdx.x;
  for (int k = i; k < K; k += kDownMmaWarps * 32) slot_weights[k] = weights[size_t(t) * K + k];  // stage_split syncs
  SharedValue sv;
  if (i < 16 && r0 + i < H) sv.load(shared, t, H, r0 + i);
  stage_split<BITS, L, G, kDownMmaWarps * 32>(h + size_t(t) * K * I, K, K, I, s.xb, s.pow2, s.xsum);

  for (int item = warp; item < items; item += kDownMmaWarps) {  // uniform over the warp
    const int k = item / nblocks, lb = item % nblocks;
    const WeightArgs W[1] = {weights_k(k)};
    float acc[1][2][1] = {};
    mma_dot_rows<BITS, L, G, 1, 1, 1>(StagedX{s.xb, s.pow2, s.xsum, s.nquads, K, k}, W, r0, lb, lb + 1, acc);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float v = sum_lanes(acc[0][hh][0], 4);
      if ((lane & 3) == 0) partial[(k * nblocks + lb) * 16 + 8 * hh + g] = v;
    }
  }
  __syncthreads();
  // Each (slot, row)'s w_k · y_k by a thread of its own, into its first partial, then each row's
  // sum of them in k order.
  for (int e = i; e < K * 16; e += kDownMmaWarps * 32) {
    const int k = e / 16, r = e % 16;
    float y = 0.f;
    for (int lb = 0; lb < nblocks; ++lb) y += partial[(k * nblocks + lb) * 16 + r];
    partial[k * nblocks * 16 + r] = __fmul_rn(slot_weights[k], y);
  }
  __syncthreads();
  if (i < 16 && r0 + i < H) {
    float o = 0.f;
#pragma unroll 4
    for (int k = 0; k < K; ++k) o = __fadd_rn(o, partial[k * nblocks * 16 + i]);
    out[size_t(t) * H + size_t(r0 + i)] = sv.plus(o, shared);
  }
  grid_dependents_may_start();
}

void check_smem(size_t need, int max, const char* what) {
  if (need > size_t(max))
    arg_fail(std::string("cuda::moe_experts: ") + what + " needs " + std::to_string(need) +
             " bytes of shared memory, more than the device's " + std::to_string(max));
}

template <int BITS>
void launch_gate_up_float(const float* x, int n, int K, const uint8_t* const* records, const ProjArgs& gate,
                          const ProjArgs& up, float* h) {
  constexpr int R = kFloatRows;
  static const int max_smem = allow_max_smem(gate_up_float_kernel<BITS>);
  const size_t smem = staged_bytes(1, gate.cols);
  check_smem(smem, max_smem, "gate/up");
  const int split_log2 = std::min(5, floor_log2(gate.cols / kChunk));
  const int rows_per_set = (kGateUpThreads >> split_log2) * R;
  const dim3 grid(unsigned((gate.rows + rows_per_set - 1) / rows_per_set), unsigned(n));
  gate_up_float_kernel<BITS><<<grid, kGateUpThreads, smem, compute_stream()>>>(x, K, records, gate, up, h, split_log2);
  CUDA_CHECK_LAUNCH();
}

template <int BITS>
void launch_down_float(const float* h, int T, int K, const uint8_t* const* records, const float* weights,
                       const ProjArgs& down, const SharedTerm& shared, float* out) {
  constexpr int R = kFloatRows;
  static const int max_smem = allow_max_smem(down_sum_float_kernel<BITS>);
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  const int split_log2 = std::min(5, floor_log2(down.cols / kChunk));
  const int groups = kDownThreads >> split_log2;
  auto blocks = [&](int quads) { return (down.rows + quads * R - 1) / (quads * R) * T; };
  // More rows a block while its items still fit one round of the groups and the blocks still
  // fill the chip twice over: each block stages all K rows of h, which fewer blocks repeat less.
  int quads = 1;
  while (quads < 16 && 2 * quads * K <= groups && blocks(2 * quads) >= 2 * sms) quads *= 2;
  const size_t smem = staged_bytes(K, down.cols) + size_t(K) * quads * R * sizeof(float);
  check_smem(smem, max_smem, "down");
  const dim3 grid(unsigned((down.rows + quads * R - 1) / (quads * R)), unsigned(T));
  down_sum_float_kernel<BITS><<<grid, kDownThreads, smem, compute_stream()>>>(h, K, records, weights, down, quads,
                                                                               shared, out, split_log2);
  CUDA_CHECK_LAUNCH();
}

size_t gate_up_mma_smem(int H, int L) { return split_bytes(1, H, L) + size_t(kGateUpMmaWarps) * 2 * 16 * sizeof(float); }

size_t down_mma_smem(int K, int I, int L) {
  return split_bytes(K, I, L) + size_t(K) * ((quads_of(I, L) / L) * 16 + 1) * sizeof(float);
}

// With `route` (route.logits given), the kernel routes the token itself (ROUTED; n = K).
template <int BITS, int L, int G, bool ROUTED>
void launch_gate_up_mma(const float* x, int n, int K, const uint8_t* const* records, const ProjArgs& gate,
                        const ProjArgs& up, float* h, const InlineRoute& route) {
  auto kernel = gate_up_mma_kernel<BITS, L, G, ROUTED>;
  static KernelLimits lim;
  const size_t smem = gate_up_mma_smem(gate.cols, L) + (ROUTED ? route_in_block_bytes(route.E, K, kGateUpMmaWarps) : 0);
  const int resident = resident_blocks(kernel, kGateUpMmaWarps * 32, smem, lim, "cuda::moe_experts: gate/up", gate.cols);
  const int ks_log2 = mma_split_log2(gate.rows, quads_of(gate.cols, L) / L, n, resident, kGateUpMmaWarps);
  const dim3 grid(unsigned(mma_sets(gate.rows, kGateUpMmaWarps, ks_log2)), unsigned(n));
  launch_overlapped(kernel, lim.overlap, grid, kGateUpMmaWarps * 32, smem, x, K, records, gate, up, h, ks_log2, route);
}

template <int BITS, int L, int G>
void launch_down_mma(const float* h, int T, int K, const uint8_t* const* records, const float* weights,
                     const ProjArgs& down, const SharedTerm& shared, float* out) {
  auto kernel = down_mma_kernel<BITS, L, G>;
  static KernelLimits lim;
  const size_t smem = down_mma_smem(K, down.cols, L);
  resident_blocks(kernel, kDownMmaWarps * 32, smem, lim, "cuda::moe_experts: down", down.cols);
  const dim3 grid(unsigned((down.rows + 15) / 16), unsigned(T));
  launch_overlapped(kernel, lim.overlap, grid, kDownMmaWarps * 32, smem, h, K, records, weights, down, shared,
                    out);
}

// Whether a lane may load several of a projection's scales (and biases) at once: records are
// 16-byte aligned, so their offsets decide.
bool scales_fit(const ProjArgs& p) { return p.scales % 8 == 0 && p.biases % 8 == 0; }

// gate and up (affine, BITS bits) on the tensor cores, in the lane layout both allow; routed by
// the kernel itself where route.logits is given.
template <int BITS>
void gate_up(const float* x, int n, int K, const uint8_t* const* records, const ProjArgs& gate, const ProjArgs& up,
             float* h, const InlineRoute& route) {
  const int group_log2 = std::min(gate.chunks_per_group_log2, up.chunks_per_group_log2);
  const bool groups_fit = gate.chunks_per_group_log2 == up.chunks_per_group_log2 && scales_fit(gate) && scales_fit(up);
  with_lane_layout<BITS>(gate.cols, group_log2, groups_fit, [&](auto L, auto G) {
    if (route.logits)
      launch_gate_up_mma<BITS, L, G, true>(x, n, K, records, gate, up, h, route);
    else
      launch_gate_up_mma<BITS, L, G, false>(x, n, K, records, gate, up, h, route);
  });
}

template <int BITS>
void down_sum(const float* h, int T, int K, const uint8_t* const* records, const float* weights, const ProjArgs& down,
              const SharedTerm& shared, float* out) {
  with_lane_layout<BITS>(down.cols, down.chunks_per_group_log2, scales_fit(down), [&](auto L, auto G) {
    launch_down_mma<BITS, L, G>(h, T, K, records, weights, down, shared, out);
  });
}

ProjArgs proj_args(const RecordMat& m, const char* name) {
  const std::string what = std::string("cuda::moe_experts: ") + name + " ";
  if (m.rows <= 0 || m.cols <= 0 || m.cols % kChunk != 0)
    arg_fail(what + "[" + std::to_string(m.rows) + ", " + std::to_string(m.cols) +
             "]: cols must be a positive multiple of 32");
  if (m.q_offset % 16 != 0) arg_fail(what + "q_offset " + std::to_string(m.q_offset) + " is not 16-byte aligned");
  if (m.bits == 16) return {m.q_offset, 0, 0, m.rows, m.cols, 0, 0, ScaleType::BF16};
  if (m.bits < 2 || m.bits > 8 || m.bits == 7)
    arg_fail(what + "bits " + std::to_string(m.bits) + " is not 16 (bf16), 2, 3, 4, 5, 6 or 8");
  if ((m.group != 16 && m.group != 32 && m.group != 64 && m.group != 128) || m.cols % m.group != 0)
    arg_fail(what + "group " + std::to_string(m.group) + " is not 16, 32, 64 or 128 dividing cols " +
             std::to_string(m.cols));
  const size_t entry = scale_size(m.scale_type);
  if (m.scales_offset % entry != 0 || m.biases_offset % entry != 0)
    arg_fail(what + "scales or biases offset is not aligned to its " + std::to_string(entry) + "-byte entries");
  return {m.q_offset, m.scales_offset, m.biases_offset, m.rows, m.cols,
          m.group >= kChunk ? floor_log2(m.group / kChunk) : 0, floor_log2(m.group), m.scale_type};
}

bool on_tensor_cores(const RecordMat& m) { return m.bits != 16 && tensor_core_layout(m.bits, m.group, m.scale_type); }

}  // namespace

void route_topk(const float* logits, int T, int E, int K, bool norm_topk, float* probs, int* ids, float* weights,
                const uint8_t* const* table, const uint8_t** records) {
  if (E <= 0 || E > kMaxExperts)
    arg_fail("cuda::route_topk: " + std::to_string(E) + " experts; 1.." + std::to_string(kMaxExperts) + " supported");
  if (K < 1 || K > E) arg_fail("cuda::route_topk: top-k " + std::to_string(K) + " outside 1.." + std::to_string(E));
  if (T <= 0) return;
  if (table && !records) arg_fail("cuda::route_topk: a table of records and nowhere to put the routed ones");
  launch_after(route_kernel, unsigned(T), kRouteThreads, route_kernel_bytes(E, K), logits, E, K, norm_topk, probs,
               ids, weights, table, records);
  CUDA_CHECK_LAUNCH();
}

size_t moe_scratch_floats(int T, int K, const RecordMat (&proj)[3]) {
  return size_t(std::max(T, 0)) * size_t(std::max(K, 0)) * size_t(std::max(proj[0].rows, 0));
}

namespace {

struct Projections {
  ProjArgs gate, up, down;
};

// proj checked as moe_experts takes it (one expert's [I, H], [I, H], [H, I]; gate and up of one
// width) for T·K rows.
Projections checked_projections(int T, int K, const RecordMat (&proj)[3], const char* who) {
  if (K < 1 || int64_t(T) * K > 65535)
    arg_fail(std::string(who) + ": T " + std::to_string(T) + " x K " + std::to_string(K) + " rows; 1..65535 in one call");
  const Projections p{proj_args(proj[0], "gate"), proj_args(proj[1], "up"), proj_args(proj[2], "down")};
  const int I = p.gate.rows, H = p.gate.cols;
  if (p.up.rows != I || p.up.cols != H || p.down.rows != H || p.down.cols != I)
    arg_fail(std::string(who) + ": projections gate [" + std::to_string(I) + ", " + std::to_string(H) + "], up [" +
             std::to_string(p.up.rows) + ", " + std::to_string(p.up.cols) + "], down [" + std::to_string(p.down.rows) +
             ", " + std::to_string(p.down.cols) + "] do not fit one expert ([I, H], [I, H], [H, I])");
  if (proj[0].bits != proj[1].bits)
    arg_fail(std::string(who) + ": gate has " + std::to_string(proj[0].bits) + " bits, up " +
             std::to_string(proj[1].bits) + "; they run fused and must match");
  return p;
}

// The shared term the down launch adds (none where shared is null), checked for `who`.
SharedTerm shared_term(const float* shared, const float* shared_logit, const char* who) {
  if (shared && !shared_logit) arg_fail(std::string(who) + ": a shared expert's output without its gate's logits");
  return {shared, shared_logit};
}

// h [n, I] = silu(gate·x) · (up·x) of each row's expert (moe_experts' first launch).
void launch_gate_up(const float* x, int n, int K, const uint8_t* const* records, const RecordMat (&proj)[3],
                    const Projections& p, float* h, const InlineRoute& route) {
  if (!on_tensor_cores(proj[0]) || !on_tensor_cores(proj[1]))
    return with_bits<16, 2, 3, 4, 5, 6, 8>(proj[0].bits, "cuda::moe_experts", [&](auto B) {
      launch_gate_up_float<B>(x, n, K, records, p.gate, p.up, h);
    });
  with_bits<2, 3, 4, 8>(proj[0].bits, "cuda::moe_experts",
                        [&](auto B) { gate_up<B>(x, n, K, records, p.gate, p.up, h, route); });
}

// out from h [T·K, I] (moe_experts' second launch): down, the weighted sum over the slots and the
// shared term.
void launch_down(const float* h, int T, int K, const uint8_t* const* records, const float* weights,
                 const RecordMat (&proj)[3], const Projections& p, const SharedTerm& sh, float* out) {
  if (!on_tensor_cores(proj[2]))
    return with_bits<16, 2, 3, 4, 5, 6, 8>(proj[2].bits, "cuda::moe_experts", [&](auto B) {
      launch_down_float<B>(h, T, K, records, weights, p.down, sh, out);
    });
  with_bits<2, 3, 4, 8>(proj[2].bits, "cuda::moe_experts",
                        [&](auto B) { down_sum<B>(h, T, K, records, weights, p.down, sh, out); });
}

}  // namespace

void moe_experts(const float* x, int T, int K, const uint8_t* const* records, const float* weights,
                 const RecordMat (&proj)[3], float* out, float* scratch, const float* shared,
                 const float* shared_logit) {
  if (T <= 0) return;
  const Projections p = checked_projections(T, K, proj, "cuda::moe_experts");
  if (!aligned(x, 16) || !aligned(out, 16) || !aligned(scratch, 16))
    arg_fail("cuda::moe_experts: x, out and scratch must be 16-byte aligned");
  const SharedTerm sh = shared_term(shared, shared_logit, "cuda::moe_experts");
  launch_gate_up(x, T * K, K, records, proj, p, scratch, InlineRoute{});
  launch_down(scratch, T, K, records, weights, proj, p, sh, out);
}

bool routes_in_gate_up(const InlineRoute& r, int K, const RecordMat (&proj)[3]) {
  return r.logits && r.table && r.E > 0 && K >= 1 && K <= r.E && routes_in_warp(r.E, K) && on_tensor_cores(proj[0]) &&
         on_tensor_cores(proj[1]) && proj[0].bits == proj[1].bits;
}

void moe_gate_up_routed(const float* x, int K, const InlineRoute& r, const RecordMat (&proj)[3], float* h) {
  if (!routes_in_gate_up(r, K, proj))
    arg_fail("cuda::moe_gate_up_routed: E " + std::to_string(r.E) + ", K " + std::to_string(K) + ", gate/up bits " +
             std::to_string(proj[0].bits) + (r.table ? "" : ", no table") + " (routes_in_gate_up)");
  if (!r.probs || !r.ids || !r.weights || !r.records)
    arg_fail("cuda::moe_gate_up_routed: route_topk's outputs (probs, ids, weights, records) must all be given");
  const Projections p = checked_projections(1, K, proj, "cuda::moe_gate_up_routed");
  if (!aligned(x, 16) || !aligned(h, 16)) arg_fail("cuda::moe_gate_up_routed: x and h must be 16-byte aligned");
  launch_gate_up(x, K, K, nullptr, proj, p, h, r);
}

void moe_down(const float* h, int T, int K, const uint8_t* const* records, const float* weights,
              const RecordMat (&proj)[3], float* out, const float* shared, const float* shared_logit) {
  if (T <= 0) return;
  const Projections p = checked_projections(T, K, proj, "cuda::moe_down");
  if (!aligned(h, 16) || !aligned(out, 16)) arg_fail("cuda::moe_down: h and out must be 16-byte aligned");
  launch_down(h, T, K, records, weights, proj, p, shared_term(shared, shared_logit, "cuda::moe_down"), out);
}

}  // namespace ms::cuda
