#pragma once
// The CUDA backend (model/backend.h): the dense weights resident in VRAM (DeviceWeights), the
// routed experts in the VRAM pool (backends/cuda/device_store.h), activations and the sequence's
// caches in device memory, the cuda:: kernels. Host round trips: the embedded rows in, the router
// probabilities of each MoE layer out (the routed ids group tokens by expert) and the grouping
// back in, the results out; a decode token's MoE routes on the GPU instead (moe).
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include "backends/cuda/device_state.h"
#include "backends/cuda/device_store.h"
#include "backends/cuda/device_weights.h"
#include "backends/cuda/hybrid.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/int_gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/stream.h"
#include "kernels/sampling.h"
#include "model/moe.h"
#include "model/weights.h"

namespace ms {

// A record's projection as the CUDA kernels take it.
cuda::RecordMat record_mat(const ProjLayout& l);

struct CudaBackend {
  using Buf = cuda::DeviceArray<float>;
  using KV = DeviceKV;
  using Linear = DeviceLinear;

  const DeviceWeights& weights;
  DeviceState& state;
  DeviceExpertStore* experts = nullptr;  // an engine directory's streamed experts
  // The position of the tokens, read on the GPU where given (a captured decode step's), instead
  // of the pos0 the calls pass.
  const int* step_pos = nullptr;
  // The hybrid decode (--cpu-experts other than off): a decode token's routed experts take the
  // integer product, and the VRAM misses the placement gives the CPU are computed there.
  HybridExperts* hybrid = nullptr;
  mutable HybridExperts::ChunkSplit chunk_split;  // take_elsewhere's, for run_elsewhere's statistics

  Buf alloc(size_t n) const { return Buf(n); }
  Buf upload(const std::vector<float>& host) const { return Buf::from(host.data(), host.size()); }
  std::vector<float> to_host(const Buf& b) const { return b.to_vector(); }
  const Mat& mat(const Mat& m) const { return weights.mat(m); }
  MlpWeights mlp_weights(const MlpWeights& m) const { return {mat(m.gate), mat(m.up), mat(m.down)}; }
  const float* vec(const std::vector<float>& v) const { return weights.vec(v); }
  KV& kv(int layer) const { return state.kv[size_t(layer)]; }
  KV& mtp_kv() const { return state.mtp_kv; }
  Linear& linear(int layer) const { return state.linear[size_t(layer)]; }

  void matmul(const float* x, int T, const Mat& W, float* y) const { cuda::matmul(x, T, W, y); }
  // x · Wᵀ for each part W (host matrices) in turn, part after part in y ([T, rows] each); for a
  // decode token of parts copied as one matrix (DeviceWeights::stacked), one launch.
  void matmul_stack(const float* x, int T, std::initializer_list<const Mat*> parts, float* y) const;
  void rmsnorm(const float* x, int rows, int dim, const float* w, float offset, float eps, float* out) const {
    cuda::rmsnorm(x, rows, dim, w, offset, eps, out);
  }
  void add_rmsnorm(float* x, const float* y, int rows, int dim, const float* w, float offset, float eps,
                   float* out) const {
    cuda::add_rmsnorm(x, y, rows, dim, w, offset, eps, out);
  }
  // A float32 cache takes k and v in place; any other has them rotated and encoded
  // (cuda::kv_store) from rows of their own.
  void attention_prepare(const float* q_raw, const float* k, const float* v, int T, int nh, int nkv, int hd, bool gated,
                         const float* q_norm, const float* k_norm, float offset, float eps, int rot_dim, int pos0,
                         double theta, float* q, float* gate, KV& cache) const {
    const size_t rows = size_t(T) * size_t(nkv) * size_t(hd);
    const Buf k_rows = cache.exact() ? Buf{} : alloc(rows), v_rows = cache.exact() ? Buf{} : alloc(rows);
    float* k_out = cache.exact() ? reinterpret_cast<float*>(cache.k.data()) : k_rows.data();
    float* v_out = cache.exact() ? reinterpret_cast<float*>(cache.v.data()) : v_rows.data();
    cuda::attention_prepare({.q_raw = q_raw, .k = k, .v = v, .q_norm = q_norm, .k_norm = k_norm, .q = q, .gate = gate,
                             .k_cache = k_out, .v_cache = v_out, .pos_on_device = step_pos, .theta = theta,
                             .offset = offset, .eps = eps, .T = T, .nh = nh, .nkv = nkv, .hd = hd, .rot_dim = rot_dim,
                             .pos0 = pos0, .gated = gated, .rows_from_zero = !cache.exact()});
    if (cache.exact()) return;
    cuda::kv_store(k_out, T, nkv, hd, cache.k_side, rotation(cache.k_rot), cache.k.data(), pos0, step_pos);
    cuda::kv_store(v_out, T, nkv, hd, cache.v_side, rotation(cache.v_rot), cache.v.data(), pos0, step_pos);
  }
  // A captured step's positions are bounded by its caches' rows; else they are pos0 + T. Over
  // rotated keys q takes their rotation, and over rotated values the output is rotated back
  // before the gate.
  void attention(const float* q, const KV& cache, int T, int pos0, int nh, int nkv, int hd, const float* gate,
                 float* out) const {
    const int positions = step_pos ? cache.capacity() : pos0 + T;
    const Buf scratch = alloc(cuda::attention_scratch_floats(T, nh, hd, positions));
    const size_t rows = size_t(T) * size_t(nh);
    Buf q_rot;
    if (cache.k_rot) {
      q_rot = alloc(rows * size_t(hd));
      cuda::copy_on_device(q_rot.data(), q, rows * size_t(hd) * sizeof(float));
      cuda::kv_rotate(q_rot.data(), rows, hd, cache.k_rot->view(), false);
      q = q_rot.data();
    }
    cuda::attention(q, cache.k_rows(), cache.v_rows(), T, pos0, nh, nkv, hd, out, scratch.data(), positions, step_pos,
                    cache.v_rot ? nullptr : gate);
    if (cache.v_rot) cuda::kv_rotate(out, rows, hd, cache.v_rot->view(), true, gate);
  }
  static cuda::KvRotationView rotation(const std::shared_ptr<const DeviceRotation>& r) {
    return r ? r->view() : cuda::KvRotationView{};
  }
  // down(silu(gate x) * up x); gate and up in one launch for a decode token's affine weights.
  void mlp(const MlpWeights& w, const float* x, int T, float* out) const {
    const size_t n = size_t(T) * size_t(w.gate.rows);
    const Buf h = alloc(n), u = alloc(n);
    mlp(w, x, T, h.data(), u.data(), out);
  }
  void softmax(float* x, int rows, int n) const { cuda::softmax(x, rows, n); }
  // model/moe.h's route() on the GPU (cuda::route_topk: the CPU path's arithmetic and ids):
  // only ids and weights [T, K] come to the host, and probs [T, E] where given.
  void route_topk(const float* logits, int T, int E, int K, bool norm_topk, int* ids, float* weights,
                  float* probs) const;
  void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T, int nk,
                        int nv, int dk, int dv, float* st, float* out) const {
    cuda::gated_delta_rule(q, k, v, g, beta, T, nk, nv, dk, dv, st, out);
  }
  void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out) const {
    cuda::rmsnorm_gated(x, z, w, rows, dim, eps, out);
  }
  void deltanet_prepare(const float* qkvz, const float* ba, int T, int nk, int nv, int dk, int dv, const float* conv_w,
                        int conv_k, float* conv_state, const float* A, const float* dt_bias, float eps,
                        float q_scale, float* q, float* k, float* v, float* z, float* g, float* beta) const {
    cuda::deltanet_prepare({.qkvz = qkvz, .ba = ba, .conv_w = conv_w, .A = A, .dt_bias = dt_bias,
                            .conv_state = conv_state, .q = q, .k = k, .v = v, .z = z, .g = g, .beta = beta, .T = T,
                            .nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = conv_k, .eps = eps, .q_scale = q_scale});
  }
  void shared_gate_add(float* out, const float* s, const float* x, const Mat& gate_w, int T, int H) const {
    // A quantized gate row (an MLX import's) or a float32 one (a GGUF's): logits by the matmul.
    if (gate_w.type != WeightType::BF16) {
      Buf logit = alloc(size_t(T));
      cuda::matmul(x, T, gate_w, logit.data());
      cuda::shared_logit_add(out, s, logit.data(), T, H);
      return;
    }
    cuda::shared_gate_add(out, s, x, gate_w, T, H);
  }

  // A MoE layer: a decode token's over an engine directory's experts as moe_decode runs it, any
  // other as model/moe.h groups it.
  void moe(const ModelConfig& cfg, const FfnWeights& w, const float* x, int T, float* out, int* routes,
           float* router_probs, const int* forced_routes) const;
  // The token cuda::pick makes from logits [vocab] in device memory, in the state's workspace.
  int pick(const float* logits, int vocab, const PickInputs& in) const;
  // Copies what moe_decode left for the host: state.route_ids and route_probs in one copy each.
  void finish() const;
  // Where the VRAM pools stream: they prefetch predicted experts into VRAM staging (those the host
  // tier lacks go on to its prefetch from disk), or without VRAM staging the host tier alone
  // prefetches from disk. A step whose experts are all in VRAM predicts nothing (and is a graph).
  ExpertPrefetcher* prefetch_store() const {
    if (!experts || !experts->streams()) return nullptr;
    if (experts->prefetching()) return experts;
    return experts->host_store().prefetching() ? &experts->host_store() : nullptr;
  }
  struct PendingRoutes {
    int* ids;      // host, top_k of them, or null
    float* probs;  // host, n_experts of them, or null
    int layer;     // of the expert store
  };
  mutable std::vector<PendingRoutes> pending_routes;
  // model/predict.h's: a prediction's router logits on their way to the host without a wait
  // (DeviceState::prediction_slots). `then` gets them at the forward's next routing on the host
  // (which waits for the device anyway) if that is not past `target`, an expert-store layer;
  // else, or if the forward routes nothing more on the host, they are dropped.
  void to_host_later(const Buf& b, int target, std::function<void(const float*)> then) const;
  struct PendingPrediction {
    int target, slot;
    std::function<void(const float*)> then;
  };
  mutable std::vector<PendingPrediction> pending_predictions;
  // Before the host waits for the routing of expert-store layer `layer`: the predictions for it
  // and later layers go to their store (which copies ahead while the router runs), the rest are dropped.
  void hand_over_predictions(int layer) const;

  // model/moe.h's primitives. The users of every expert, concatenated in expert order, uploaded
  // in one copy.
  struct ExpertGroups {
    cuda::DeviceArray<int> rows;   // [2, users]: the token row of each user, then its (token * K + slot)
    cuda::DeviceArray<float> weights;
    std::vector<size_t> first;  // [n_experts + 1]: where each expert's users start
  };
  ExpertGroups expert_groups(const std::vector<std::vector<int>>& users, const std::vector<float>& weights, int K) const;
  void gather_users(const ExpertGroups& g, int e, const float* x, int H, float* xb) const {
    cuda::gather_rows(x, g.rows.data() + g.first[size_t(e)], users_of(g, e), H, xb);
  }
  void scatter_users(const ExpertGroups& g, int e, const float* yb, int H, float* partial) const {
    const size_t total = g.first.back();
    cuda::scatter_scaled(yb, g.rows.data() + total + g.first[size_t(e)], g.weights.data() + g.first[size_t(e)],
                         users_of(g, e), H, partial);
  }
  void sum_slots(const float* partial, int T, int K, int H, float* out) const { cuda::sum_slots(partial, T, K, H, out); }
  // model/moe.h's TogetherExperts: a prompt chunk's experts of the integer GEMM's layouts run
  // together (cuda::int_experts), each over its users straight from x.
  bool runs_together(const MlpWeights& w, int T) const {
    return T >= cuda::kIntGemmMinTokens && cuda::int_experts_layout(w.gate, w.up, w.down);
  }
  void run_together(const ExpertGroups& g, const std::vector<ExpertCall>& calls, const float* x, int T,
                    float* partial) const;
  // model/moe.h's ElsewhereExperts, the hybrid prefill: of a prompt chunk's experts (from
  // kIntGemmMinTokens tokens on, where the GPU's take the integer product) the misses the
  // placement gives the CPU, and every expert of a --cpu-experts N layer. Their users' rows come
  // up in one copy and are scaled into `partial` as the GPU's are.
  std::vector<int> take_elsewhere(int layer, const float* x, int T, std::vector<int>& order,
                                  const std::vector<std::vector<int>>& users) const;
  void run_elsewhere(int layer, const ExpertGroups& g, const std::vector<int>& experts,
                     const std::vector<std::vector<int>>& users, float* partial) const;

 private:
  static int users_of(const ExpertGroups& g, int e) { return int(g.first[size_t(e) + 1] - g.first[size_t(e)]); }
  // mlp in the caller's h and u ([T, inter] each; u unused where gate and up fuse), for work
  // that may not take memory (a cuda::SideStream's).
  void mlp(const MlpWeights& w, const float* x, int T, float* h, float* u, float* out) const;
  // One token's MoE layer of an engine directory in a few launches: the router's top-k on the
  // GPU, then cuda::moe_experts over the routed records. The routed ids come to the host only
  // when the layer's pool streams (to read its misses); they and the router probabilities go to
  // state.route_ids and route_probs, and at finish() to `routes` and `router_probs` where given.
  // With a shared expert, out gets its gated add too (shared_gate_add's): the expert runs on a
  // SideStream beside the router and the routing, and its add is in the down kernel where the
  // gate's row was copied with the router's (DeviceWeights::stacked), the gate's logit then one
  // of the router's. Where T is 1 and the layer's experts are an engine directory's.
  void moe_decode(const ModelConfig& cfg, const FfnWeights& w, const float* x, float* out, int* routes,
                  float* router_probs) const;
  // What both decode paths begin a MoE layer with: the shared expert queued on a side stream, the
  // router's logits (with the shared gate's where its row was copied with theirs), where the
  // layer's ids and probabilities go, its resident table (null where it streams), room for K
  // record addresses and the records' layout.
  struct DecodeLayer {
    // Declared before `side`, whose end joins the side stream: the shared expert's buffers are
    // given back (on the compute stream) only after that.
    Buf shared, shared_h, shared_u, logits, weights;
    std::optional<cuda::SideStream> side;
    bool gate_with_router = false;
    int* ids = nullptr;
    float* probs = nullptr;
    const uint8_t* const* table = nullptr;
    cuda::DeviceArray<const uint8_t*> records;
    cuda::RecordMat proj[3];
  };
  void begin_decode_layer(const ModelConfig& cfg, const FfnWeights& w, const float* x, DecodeLayer& d) const;
  // moe_decode under the hybrid decode: the routed experts by cuda::int_expert_records into a row
  // per slot, summed in slot order (sum_slots), then the shared expert's gated add. Where the
  // layer streams, the ids, weights and input come to the host in one wait, the placement splits
  // the misses between copies and the CPU, and the CPU's rows go up before the sum.
  void moe_decode_int(const ModelConfig& cfg, const FfnWeights& w, const float* x, float* out, int* routes,
                      float* router_probs) const;
  // The GPU's half of a streamed layer under the hybrid decode, the routed ids and weights on
  // the host: the placement, then `run` of a table of K host-side record addresses (null: a slot
  // not in it), once for the experts in VRAM before the misses' copies are queued and once for
  // the copied ones (or once for all where nothing is copied). Returns the split.
  using GpuExperts = std::function<void(const std::vector<const uint8_t*>&)>;
  HybridExperts::Split place_and_run(int layer, const GpuExperts& run) const;
};

}  // namespace ms
