#pragma once
// The CUDA backend of the forward (model/blocks.h), built only with MOESTREAM_CUDA: the dense
// weights resident in VRAM (DeviceWeights), the routed experts in the VRAM pool
// (experts/device_store.h), activations and the sequence's caches in device memory, the cuda::
// kernels. Host round trips: the embedded rows in, the router probabilities of each MoE layer
// out (the routed ids group tokens by expert) and the grouping back in, the results out.
#if MOESTREAM_CUDA
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "experts/device_store.h"
#include "kernels/cuda/ops.h"
#include "model/state.h"
#include "model/weights.h"

namespace ms {

// Stream-ordered device memory on the compute stream (cudaMallocAsync, small sizes reused):
// cheap enough to take per activation. device_free takes the size device_alloc was given.
void* device_alloc(size_t bytes);
void device_free(void* p, size_t bytes);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Queued on the compute stream; src (host memory) may be reused once it returns.
void copy_to_device_async(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
void zero_on_device(void* dst, size_t bytes);

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : p_(static_cast<T*>(device_alloc(n * sizeof(T)))), n_(n) {}
  ~DeviceArray() { device_free(p_, n_ * sizeof(T)); }
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  static DeviceArray from(const T* host, size_t n) {
    DeviceArray a(n);
    copy_to_device(a.p_, host, n * sizeof(T));
    return a;
  }
  std::vector<T> to_vector() const {
    std::vector<T> v(n_);
    copy_to_host(v.data(), p_, n_ * sizeof(T));
    return v;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// The device memory of a captured decode step (DecodeGraph). While an ArenaScope is open on a
// thread, device_alloc there takes from its arena and device_free gives the arena's buffers back
// to it. A graph replays the addresses it was captured with, so its activations stay its own for
// its life; within the capture a freed buffer may serve a later allocation, since the step is
// one chain of work on one stream, done with the first before the second.
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  void* take(size_t bytes);
  bool give(void* p, size_t bytes);  // false, doing nothing: not the arena's
  size_t lent() const { return lent_; }  // buffers taken and not given back

 private:
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_set<void*> mine_;
  size_t lent_ = 0;
};

class ArenaScope {
 public:
  explicit ArenaScope(DeviceArena& arena);
  ~ArenaScope();
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  DeviceArena* outer_;
};

// KVCache (model/state.h) in device memory.
struct DeviceKV {
  int n_kv = 0, head_dim = 0, length = 0;
  int planned = 0;          // kv_capacity's (model/state.h)
  DeviceArray<float> k, v;  // [capacity, n_kv, head_dim]

  void reserve(int n);  // kv_capacity's, keeping what is there
  float* k_at(int pos) const { return k.data() + size_t(pos) * size_t(n_kv) * size_t(head_dim); }
  float* v_at(int pos) const { return v.data() + size_t(pos) * size_t(n_kv) * size_t(head_dim); }
  int capacity() const { return int(k.size() / std::max<size_t>(1, size_t(n_kv) * size_t(head_dim))); }
};

struct DeviceLinear {  // LinearState in device memory
  DeviceArray<float> conv, recurrent;
};

// What a captured decode step takes from the host and gives back (DecodeGraph).
enum class StepKind {
  HostInput,        // the host's embedding and position in; the host reads logits and routes after it
  Ahead,            // embeds DecodeGraph::token; ends with the greedy token, the next position and decode_ring
  AheadWithRoutes,  // Ahead, and the step's routed ids to decode_route_ring
};

// A sequence's decode step (one token, every routed expert resident) captured as a CUDA graph
// (Model::forward): its input and outputs at fixed addresses, the position read on the GPU. The
// graph holds the addresses of the sequence's KV caches too: it is captured again when one
// grows (kv_at_capture). A step ahead (StepKind, Model::decode_ahead) embeds its token on the GPU
// and ends with the greedy token, which is the next replay's, and the next position: replays
// then follow each other with nothing from the host between them.
struct DecodeGraph {
  DeviceArena arena;  // first: outlives the graph that uses it
  cuda::Graph graph;
  DeviceArray<float> input;   // [hidden + 1]: the token's embedding (the layers' x), then its position, an int
  DeviceArray<float> normed;  // [hidden]: x after the final norm
  DeviceArray<float> logits;  // [vocab]
  std::vector<const float*> kv_at_capture;
  StepKind kind = StepKind::HostInput;
  DeviceArray<int> token;          // ahead: [1], the token embedded, then the one picked
  cuda::SamplerWorkspace sampler;  // ahead: greedy_token's

  int* position() const { return reinterpret_cast<int*>(input.data() + input.size() - 1); }
  // Whether this graph runs a step of `k` over the KV caches at `kv` (else it must be captured anew).
  bool fits(StepKind k, const std::vector<const float*>& kv) const { return kind == k && kv_at_capture == kv; }
};

// A State's caches on the GPU; State holds one once the sequence has run there.
struct DeviceState {
  DeviceState(const ModelConfig& cfg, int planned_positions);  // State::planned_positions()
  std::vector<DeviceKV> kv;
  std::vector<DeviceLinear> linear;
  DeviceKV mtp_kv;
  std::unique_ptr<DecodeGraph> decode_graph;  // made at the first decode step that can use one
  // Where an ahead step leaves its token for the host: slot position % kDecodeRing. It outlives
  // the graphs, which a cache's growth replaces while a step's token is still unread.
  static constexpr int kDecodeRing = 4;
  std::unique_ptr<cuda::MappedInts> decode_ring;
  std::unique_ptr<cuda::MappedInts> decode_route_ring;  // [kDecodeRing][route_ids.size()]: route_ids by slot
  // A decode token's routed ids [layer][top_k] and router probabilities [layer][n_experts], by
  // expert-store layer, where moe_on_device writes them: one copy brings every layer's when the
  // forward asks for them, and a captured step writes them at addresses that stay.
  DeviceArray<int> route_ids;
  DeviceArray<float> route_probs;
  int top_k = 0, n_experts = 0;
};
// The linear-attention states between host (checkpoints) and device; layers without one skip.
void download_linear(const DeviceState& d, std::vector<LinearState>& host);
void upload_linear(DeviceState& d, const std::vector<LinearState>& host);

// Every matrix and vector of ModelWeights copied to VRAM, found by its host address (the experts
// of a checkpoint's MoE layers too; an engine directory's stream through the VRAM pool). f32
// matrices are refused: cuda::matmul reads bf16 and affine weights.
class DeviceWeights {
 public:
  explicit DeviceWeights(const ModelWeights& w);
  const Mat& mat(const Mat& host) const;
  // The matrix of the parts' rows in order, where they were copied as one (add_stack), else null.
  const Mat* stacked(std::initializer_list<const Mat*> parts) const;
  const float* vec(const std::vector<float>& host) const;
  size_t bytes() const { return bytes_; }
  // The embedding table too, for decode steps that embed their token on the GPU
  // (Model::decode_ahead), where it takes no more than `room` bytes and is not f32; has(embed)
  // then tells whether it is in VRAM (a tied lm_head's always is).
  void add_embedding(const Mat& embed, uint64_t room);
  bool has(const Mat& host) const { return mats_.count(host.data) != 0; }

 private:
  struct Stack {
    Mat whole;
    std::vector<const void*> parts;  // their host addresses, in order
  };
  void add(const Mat& m, const char* what);
  // Matrices a forward multiplies by the same x, as one matrix of their rows where they share a
  // format and width (else each alone), so that a decode token's product is one launch.
  void add_stack(const std::vector<const Mat*>& parts, const char* what);
  void upload_rows(const std::vector<const Mat*>& parts, const char* what);
  void add(const std::vector<float>& v);
  std::vector<DeviceArray<unsigned char>> buffers_;
  std::unordered_map<const void*, Mat> mats_;
  std::unordered_map<const void*, Stack> stacks_;  // by the first part's host address
  std::unordered_map<const float*, const float*> vecs_;
  size_t bytes_ = 0;
};

struct CudaBackend {
  using Buf = DeviceArray<float>;
  using KV = DeviceKV;
  using Linear = DeviceLinear;
  static constexpr bool kOnDevice = true;

  const DeviceWeights& weights;
  DeviceState& state;
  DeviceExpertStore* experts = nullptr;  // an engine directory's streamed experts
  // The position of the tokens, read on the GPU where given (a captured decode step's), instead
  // of the pos0 the calls pass.
  const int* step_pos = nullptr;

  Buf alloc(size_t n) const { return Buf(n); }
  Buf upload(const std::vector<float>& host) const { return Buf::from(host.data(), host.size()); }
  std::vector<float> to_host(const Buf& b) const { return b.to_vector(); }
  const Mat& mat(const Mat& m) const { return weights.mat(m); }
  MlpWeights mlp(const MlpWeights& m) const { return {mat(m.gate), mat(m.up), mat(m.down)}; }
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
  void attention_prepare(const float* q_raw, const float* k, const float* v, int T, int nh, int nkv, int hd, bool gated,
                         const float* q_norm, const float* k_norm, float offset, float eps, int rot_dim, int pos0,
                         double theta, float* q, float* gate, KV& cache) const {
    cuda::attention_prepare({q_raw, k, v, q_norm, k_norm, q, gate, cache.k.data(), cache.v.data(), step_pos, theta,
                             offset, eps, T, nh, nkv, hd, rot_dim, pos0, gated});
  }
  // A captured step's positions are bounded by its caches' rows; else they are pos0 + T.
  void attention(const float* q, const KV& cache, int T, int pos0, int nh, int nkv, int hd, const float* gate,
                 float* out) const {
    const int positions = step_pos ? cache.capacity() : pos0 + T;
    const Buf scratch = alloc(cuda::attention_scratch_floats(T, nh, hd, positions));
    cuda::attention(q, cache.k_at(0), cache.v_at(0), T, pos0, nh, nkv, hd, out, scratch.data(), positions, step_pos,
                    gate);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) const { cuda::silu_mul(gate, up, out, n); }
  // h = silu(x · gateᵀ) * (x · upᵀ) in one launch for a decode token's affine gate and up; false,
  // doing nothing, where that does not apply (mlp_forward then runs its three steps).
  bool fused_gate_up(const float* x, int T, const Mat& gate, const Mat& up, float* h) const {
    if (!cuda::gate_up_fuses(gate, up, T)) return false;
    cuda::gate_up_silu(x, gate, up, h);
    return true;
  }
  void softmax(float* x, int rows, int n) const { cuda::softmax(x, rows, n); }
  void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, int T, int nk,
                        int nv, int dk, int dv, float* st, float* out) const {
    cuda::gated_delta_rule(q, k, v, g, beta, T, nk, nv, dk, dv, st, out);
  }
  void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out) const {
    cuda::rmsnorm_gated(x, z, w, rows, dim, eps, out);
  }
  void deltanet_prepare(const float* qkvz, const float* ba, int T, int nk, int nv, int dk, int dv, const float* conv_w,
                        int conv_k, float* conv_state, const float* A_log, const float* dt_bias, float eps,
                        float q_scale, float* q, float* k, float* v, float* z, float* g, float* beta) const {
    cuda::deltanet_prepare({qkvz, ba, conv_w, A_log, dt_bias, conv_state, q, k, v, z, g, beta, T, nk, nv, dk, dv,
                            conv_k, eps, q_scale});
  }
  void shared_gate_add(float* out, const float* s, const float* x, const Mat& gate_w, int T, int H) const {
    cuda::shared_gate_add(out, s, x, gate_w, T, H);
  }

  // One token's MoE layer of an engine directory in a few launches: the router's top-k on the
  // GPU, then cuda::moe_experts over the routed records. The routed ids come to the host only
  // when the layer's pool streams (to read its misses); they and the router probabilities go to
  // state.route_ids and route_probs, and at finish() to `routes` and `router_probs` where given.
  // With a shared expert, out gets its gated add too (shared_gate_add's): the expert runs on a
  // SideStream beside the router and the routing, and its add is in the down kernel where the
  // gate's row was copied with the router's (DeviceWeights::stacked), the gate's logit then one
  // of the router's. False, doing nothing, where this does not apply (T > 1, a checkpoint's
  // experts).
  bool moe_on_device(const ModelConfig& cfg, const FfnWeights& w, const float* x, int T, float* out, int* routes,
                     float* router_probs) const;
  // Copies what moe_on_device left for the host: state.route_ids and route_probs in one copy each.
  void finish() const;
  struct PendingRoutes {
    int* ids;      // host, top_k of them, or null
    float* probs;  // host, n_experts of them, or null
    int layer;     // of the expert store
  };
  mutable std::vector<PendingRoutes> pending_routes;

  // The users of every expert, concatenated in expert order, uploaded in one copy.
  struct ExpertGroups {
    DeviceArray<int> rows;   // [2, users]: the token row of each user, then its (token * K + slot)
    DeviceArray<float> weights;
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

 private:
  static int users_of(const ExpertGroups& g, int e) { return int(g.first[size_t(e) + 1] - g.first[size_t(e)]); }
};

}  // namespace ms
#endif
