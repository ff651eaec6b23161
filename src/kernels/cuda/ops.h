#pragma once
// CUDA kernels with the CPU kernels' interface (kernels/cpu/ops.h, kernels/cpu/deltanet.h): the
// same arguments and results, every pointer a device pointer (a Mat's data, scales and biases
// too). Calls queue work on the compute stream (kernels/cuda/stream.h) and return; argument errors throw ms::Error.
// Plain C++: no CUDA headers needed to include this.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/device_memory.h"
#include "kernels/deltanet_prep.h"
#include "kernels/sampling.h"
#include "kernels/weights.h"
#include "quant/kv_quant.h"

namespace ms::cuda {

// y[T, W.rows] = x[T, W.cols] · Wᵀ for BF16, F32 (a GGUF's routers) and Affine weights (every
// layout quant/affine.h allows). W.cols must be a multiple of 32; x, y and W's buffers 16-byte
// aligned. T = 1 is the memory-bound decode matvec; larger T reuses each weight chunk for 4 tokens
// at a time. The layouts of int_gemm_layout (kernels/cuda/int_gemm.h) take the integer GEMM where
// int_matmul_pays, else this kernel; from gemm_min_tokens(W) on (kernels/cuda/gemm.h) the others
// are dequantized to float32 for a cuBLAS FP32 SGEMM (float32 weights as they are).
void matmul(const float* x, int T, const Mat& W, float* y);
// Whether affine rows of this layout go to the integer tensor cores: 2, 3, 4 or 8 bits in groups
// of 32 to 128 with bf16 scales (what moestream's own conversion writes) or f16 ones (GGUF's
// Q8_0, Q4_0 and Q4_1). The others (5 and 6 bits, groups of 16, f32 scales: GGUF's K-quants and
// Q5_x) decode to float for FMAs, slower per byte.
bool tensor_core_layout(int bits, int group, ScaleType scale_type);
// h[rows] = silu(gate · x) * (up · x) for one token: an MLP's gate and up read in one launch,
// each row's sums those matmul computes (its split of a row among warps may differ, so the last
// bits may too). Where gate_up_fuses(gate, up, 1): affine of a tensor_core_layout, of one shape,
// bits and group (each may have its own scale type).
void gate_up_silu(const float* x, const Mat& gate, const Mat& up, float* h);
bool gate_up_fuses(const Mat& gate, const Mat& up, int T);

void rmsnorm(const float* x, int rows, int dim, const float* w, float offset, float eps, float* out);
// x += y, then rmsnorm of x into out.
void add_rmsnorm(float* x, const float* y, int rows, int dim, const float* w, float offset, float eps, float* out);
// What attention_prepare reads and writes for T tokens of an attention layer: q_raw [T, nh·hd]
// (gated: [T][nh][query(hd), gate(hd)], Qwen3-Next's q_proj), k and v [T, nkv·hd], the norms' weights
// q_norm and k_norm [hd] (offset added to them); the caches' rows (nkv·hd wide) of positions
// pos0 + t. pos0 is *pos_on_device instead where that is given: read on the GPU, so that a
// captured decode step (a CUDA graph) serves every position.
// Where rows_from_zero is set, k and v go to rows t of k_cache and v_cache (kv_store's input)
// instead, still rotated by RoPE at pos0 + t.
struct AttentionPrep {
  const float *q_raw, *k, *v, *q_norm, *k_norm;
  float *q, *gate, *k_cache, *v_cache;
  const int* pos_on_device;
  double theta;
  float offset, eps;
  int T, nh, nkv, hd, rot_dim, pos0;
  bool gated;
  bool rows_from_zero = false;
};
// q [T, nh·hd] and k: each head RMS-normalised (x / sqrt(mean(x²) + eps) · (offset + w)) and
// rotated by RoPE over its first rot_dim dims; k to the k cache, v to the v cache, and the gate
// halves to gate [T, nh·hd] where gated. The CPU backend's attention_prepare
// (kernels/cpu/model_ops.h) is the reference: its split, norms, rope and store in turn.
void attention_prepare(const AttentionPrep& p);
// pos0 as for attention_prepare. positions: at least as many as any row attends (pos0 + T, or
// with pos_on_device its bound: the cache's rows). Where gate [T, n_heads·hd] is given (a gated
// layer's, from attention_prepare), out is multiplied by sigmoid(gate) elementwise. A row's
// positions are taken in chunks folded in order, the same bits whatever T is. scratch: at least
// attention_scratch_floats(T, n_heads, hd, positions) floats, 8-byte aligned (null where that is
// 0): where rows (T · n_heads) are few, each chunk is a block of its own.
size_t attention_scratch_floats(int T, int n_heads, int hd, int positions);
void attention(const float* q, const float* k, const float* v, int T, int pos0, int n_heads, int n_kv, int hd,
               float* out, float* scratch, int positions, const int* pos_on_device = nullptr,
               const float* gate = nullptr);

// The KV cache's formats (quant/kv_quant.h) as the kernels take them (kernels/cuda/kv_cache.cu).
struct KvSideView {
  int bits = 32, group = 64, row_bytes = 0, code_bytes = 0;  // code_bytes: a quantized row's codes
};
KvSideView kv_side_view(KvSide s, int hd);
struct KvRotationView {
  KvRotation kind = KvRotation::None;
  const float* blocks = nullptr;  // So4: [hd/4][4][4], in device memory
  const float* signs = nullptr;   // Hadamard: [hd]
};
// A side of a KV cache: a row of `side` per position and KV head, [positions, n_kv].
struct KvRowsView {
  const uint8_t* data;
  KvSideView side;
};
// attention over a cache of any format: the float32 overload's bits where both sides are float32.
void attention(const float* q, KvRowsView k, KvRowsView v, int T, int pos0, int n_heads, int n_kv, int hd, float* out,
               float* scratch, int positions, const int* pos_on_device = nullptr, const float* gate = nullptr);
// rows [T, n_kv, hd] rotated by r (where it rotates) and encoded as kv_encode does into the cache
// rows of positions pos0 + t (pos0 *pos_on_device where given) of a side in `side`'s format.
void kv_store(const float* rows, int T, int n_kv, int hd, KvSide side, const KvRotationView& r, uint8_t* cache,
              int pos0, const int* pos_on_device = nullptr);
// x [rows, hd] ← R·x, or Rᵀ·x where `inverse`, in place; then, where gate [rows, hd] is given,
// multiplied by sigmoid(gate) (a gated attention's output over rotated values).
void kv_rotate(float* x, size_t rows, int hd, const KvRotationView& r, bool inverse, const float* gate = nullptr);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void softmax(float* x, int rows, int n);
// Per row of x [rows, n]: the indices of the k largest values, largest first, ties to the lower
// index (cpu::top_k on each row). idx: [rows, k].
void top_k(const float* x, int rows, int n, int k, int* idx);

// The router of a MoE block on the GPU, one block per token: probs = softmax of each row of
// logits [T, E]; ids [T, K] its K largest, largest first, ties to the lower index; weights
// [T, K] their probabilities, divided by their sum (taken in k order) when norm_topk. The same
// arithmetic as cpu::softmax (exp correctly rounded, the sum in cpu::warp_order_sum's order),
// cpu::top_k and model/moe.h's route(), so that the routed ids are the CPU path's.
// E ≤ 8192. With a layer's table of expert records (device pointers by expert id), also
// records[t, k] = table[ids[t, k]]: the routed experts' records, for moe_experts.
void route_topk(const float* logits, int T, int E, int K, bool norm_topk, float* probs, int* ids, float* weights,
                const uint8_t* const* table = nullptr, const uint8_t** records = nullptr);

// One projection of an expert record (format/engine_dir.h's ProjLayout, whose fields these
// are): [rows, cols] bf16 at q_offset when bits is 16, else affine (quant/affine.h) with the q
// bit streams at q_offset and scales and biases [rows, cols/group] of scale_type at their offsets.
struct RecordMat {
  int bits = 16, group = 0, rows = 0, cols = 0;
  size_t q_offset = 0, scales_offset = 0, biases_offset = 0;
  ScaleType scale_type = ScaleType::BF16;
};

// The routed experts of T tokens, K each, in two launches: row j = t·K + k runs the expert
// whose record is records[j] on x[t]: h_j = silu(gate·x_t) · (up·x_t), y_j = down·h_j; then
// out[t] = Σ_k weights[t·K + k] · y_{t·K+k}, summed in k order (what scatter_scaled and
// sum_slots give). proj: gate [I, H], up [I, H], down [H, I], gate and up of one bit width.
// records: a device array of T·K device pointers, each 16-byte aligned, repeats allowed;
// weights [T, K]; x [T, H], out [T, H] and scratch (moe_scratch_floats) 16-byte aligned.
// Per row the arithmetic of cuda::matmul (tensor_core_layout rows on the tensor cores, the others
// in float), and the result deterministic. Rows too wide to stage in shared memory are refused.
// Where shared is given, out[t] += sigmoid(shared_logit[t]) · shared[t] after the sum
// (shared_gate_add's formula): the shared expert's output [T, H] and its gate's logit [T], added in
// the same launch.
void moe_experts(const float* x, int T, int K, const uint8_t* const* records, const float* weights,
                 const RecordMat (&proj)[3], float* out, float* scratch, const float* shared = nullptr,
                 const float* shared_logit = nullptr);
// Floats of scratch moe_experts needs: h, [T·K, I].
size_t moe_scratch_floats(int T, int K, const RecordMat (&proj)[3]);
// moe_experts' second launch alone: out from h [T·K, I] (its scratch after the first), the
// weighted sum over the slots and the shared term as moe_experts'.
void moe_down(const float* h, int T, int K, const uint8_t* const* records, const float* weights,
              const RecordMat (&proj)[3], float* out, const float* shared = nullptr, const float* shared_logit = nullptr);
// route_topk for one decode token (T = 1) with a table, done in moe_gate_up_routed: its arguments.
struct InlineRoute {
  const float* logits = nullptr;  // [E]
  int E = 0;
  bool norm_topk = false;
  float* probs = nullptr;    // [E]
  int* ids = nullptr;        // [K]
  float* weights = nullptr;  // [K]
  const uint8_t* const* table = nullptr;
  const uint8_t** records = nullptr;  // [K]
};
// moe_experts' first launch for one decode token (h [K, I]) whose blocks each route the token
// themselves, route_topk's results to r's outputs, the same bits: no launch of the routing's own
// stands between the router and the experts, and moe_down then takes r.records and r.weights.
// Where routes_in_gate_up: a table, E <= 512, K <= 32, gate and up affine of a tensor_core_layout.
bool routes_in_gate_up(const InlineRoute& r, int K, const RecordMat (&proj)[3]);
void moe_gate_up_routed(const float* x, int K, const InlineRoute& r, const RecordMat (&proj)[3], float* h);

// Gated DeltaNet (kernels/cpu/deltanet.h). gated_delta_rule runs the recurrent update for a few
// tokens and the chunked form for longer T (kernels/cuda/deltanet.h).
// The gated delta rule's inputs, in one launch: q, k [T, nk·dk] and v [T, nv·dv] the conv's
// outputs through SiLU, each head of q and k L2-normalised (x / sqrt(Σx² + eps)) and q's then
// scaled by q_scale; z [T, nv·dv] copied; beta = sigmoid(b), g = A[h]·softplus(a +
// dt_bias[h]) [T, nv]. The CPU backend's deltanet_prepare (kernels/cpu/model_ops.h) is the
// reference: its split, conv, norms and gates in turn.
void deltanet_prepare(const DeltaNetPrep& p);
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                      int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out);
void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out);

// The model's glue (model_ops.cu), each the loop of src/model/ it stands for.
// out[t] += sigmoid(gate · x[t]) * s[t], rows of H: the shared expert's gate (a bf16 [1, H] row)
// and gated add in one launch.
void shared_gate_add(float* out, const float* s, const float* x, const Mat& gate, int T, int H);
// out[t] += sigmoid(logit[t]) * s[t], rows of H: shared_gate_add for a gate whose logits [T] were
// computed already (a quantized gate row, by cuda::matmul).
void shared_logit_add(float* out, const float* s, const float* logit, int T, int H);
// dst[j] = src[rows[j]], rows of H; rows is a device array of n.
void gather_rows(const float* src, const int* rows, int n, int H, float* dst);
// dst[rows[j]] = wt[j] * y[j], rows of H; rows, wt device arrays of n.
void scatter_scaled(const float* y, const int* rows, const float* wt, int n, int H, float* dst);
// out[t] = sum over k in order of partial[t, k], rows of H.
void sum_slots(const float* partial, int T, int K, int H, float* out);
// out [table.cols] = row *id (a device int) of an embedding table (bf16 or affine), the values
// embed_tokens makes on the host, bit for bit.
void embed_row(const Mat& table, const int* id, float* out);
// The end of a decode step whose token feeds the next step on the GPU (device ints): with slot =
// *position % ring_size, ring[slot] = *token, route_ring[slot][0..n_routes) = routes (the step's
// routed ids; both rings mapped host memory, MappedInts), then ++*position. ring_size a power of
// two.
void finish_decode_step(const int* token, int* position, int* ring, int ring_size, const int* routes = nullptr,
                        int n_routes = 0, int* route_ring = nullptr);

// Sampling (cpu::sample, kernels/cpu/sample.h) on logits in device memory, so that a decode
// step brings back only the token; args and the draw r as PickInputs (kernels/sampling.h) holds them.

// sample()'s device scratch: sized on the first call, re-sized when the vocabulary changes.
struct SamplerWorkspace {
  int vocab = 0;
  DeviceArray<float> penalized, sorted;
  DeviceArray<int> ids, order, token;
  DeviceArray<double> probs;
  DeviceArray<unsigned char> cub_temp, argmax_partial;  // cub's bytes; the argmax's partial results
  DeviceArray<unsigned> argmax_done;
  DeviceArray<int> staging;  // free for the caller to stage sample()'s penalty arrays in
};

// The token cpu::sample picks from logits [vocab] (not modified) with penalties on the
// distinct seen tokens penalty_tokens[n_penalty] (in 0..vocab-1), seen penalty_counts[] times
// each (device arrays). Penalties, the candidates' order, top-k and min-p are exact; the softmax
// (CUDA's exp) and the sums of top-p and of the draw (sequential per thread, a tree across
// threads) may round differently from the CPU's by an ulp, which changes the token only when
// the draw lands within that of a boundary. Waits for the result.
int sample(const float* logits, int vocab, const int* penalty_tokens, const int* penalty_counts, int n_penalty,
           const SampleArgs& args, double r, SamplerWorkspace& ws);
// sample() of a pick's inputs (kernels/sampling.h): its seen tokens and counts staged through
// ws.staging.
int pick(const float* logits, int vocab, const PickInputs& in, SamplerWorkspace& ws);
// Sizes ws for a vocabulary (sample() does so itself; greedy_token needs it done first, outside
// any capture: it queues copies and a kernel of its own).
void fit_workspace(SamplerWorkspace& ws, int vocab);
// *token (a device int) = the greedy sample() of logits [vocab] without penalties: the first
// maximum. Queued, not waited for, so that a captured decode step may end with it.
void greedy_token(const float* logits, int vocab, SamplerWorkspace& ws, int* token);

}  // namespace ms::cuda
