#pragma once
// A loaded model (Qwen3-MoE or Qwen3-Next) and its forward pass.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/config.h"
#include "format/safetensors.h"
#include "model/state.h"
#include "model/weights.h"

namespace ms {

class DeviceWeights;      // model/backend_cuda.h
struct CudaBackend;       // model/backend_cuda.h
struct DecodeGraph;       // model/backend_cuda.h
struct DeviceState;       // model/backend_cuda.h
enum class StepKind;      // model/backend_cuda.h
class DeviceExpertStore;  // experts/device_store.h

enum class Device { Cpu, Cuda };

// Cuda when this build has the CUDA backend and a GPU it can run on is present, else Cpu.
Device default_device();

// Tokens a prompt's forward runs at once by default (ModelOptions::prefill_chunk): a multiple of
// the DeltaNet kernels' 64-token chunk, so that a chunked prefill gives a whole one's bits.
constexpr int kPrefillChunk = 512;
constexpr int kPrefillChunkAlign = 64;

struct ForwardOptions {
  bool all_logits = false;  // logits of every position, not only the last
  // false: no logits and no sample at all (a prompt's chunk before its last, whose logits no one reads)
  bool logits = true;
  bool hidden = false;      // keep the last hidden states (before and after the final norm)
  bool routes = false;      // keep the routed expert ids and router probabilities of every MoE layer
  // Picks the next token from the last position's logits where they are (device memory on
  // Cuda: on_device), so that only the token comes back; ForwardResult::logits then stays
  // empty unless all_logits.
  std::function<int(const float* logits, bool on_device)> sample;
};

struct ForwardResult {
  std::vector<float> logits;                // [all_logits ? T : 1, vocab]; empty with sample
  int token = -1;                           // what sample picked
  std::vector<float> hidden_pre_norm;       // [T, hidden]
  std::vector<float> hidden_post_norm;      // [T, hidden]
  std::vector<std::vector<int>> routes;       // [layer][T * top_k], empty for dense layers
  std::vector<std::vector<float>> router_probs;  // [layer][T * n_experts], empty for dense layers
};

// How an engine directory's experts are held: a pool of `experts.slots` per layer (or per-layer
// caps), or sized from a memory budget. A Hugging Face checkpoint keeps every expert mapped.
// On Cuda the pools are in VRAM (`experts` or `vram_budget` sizes them) over a host tier.
struct ModelOptions {
  StoreOptions experts;
  uint64_t memory_budget = 0;  // Cpu: bytes for everything (dense + KV + activations + pool); 0 = unset
  int context = 4096;          // tokens the KV budget provides for
  // Most tokens one forward runs at once: longer prompts go through in chunks (Model::next_chunk)
  // whose activations the memory plan counts. A multiple of kPrefillChunkAlign, at least twice it.
  int prefill_chunk = kPrefillChunk;
  // Cuda: dense weights in VRAM, the forward on the GPU (builds with MOESTREAM_CUDA).
  Device device = Device::Cpu;
  uint64_t vram_budget = 0;  // Cuda: VRAM for dense + KV + activations + pool; 0 = unset
  uint64_t host_cache = 0;   // Cuda: host RAM caching experts between SSD and VRAM; 0 = staging only
  PolicyKind host_policy = PolicyKind::LRU;
  // Cuda: run each decode step as a CUDA graph, captured once per sequence, where every routed
  // expert is resident in VRAM (a step then has no host round trip until the sampled token).
  bool cuda_graphs = true;
};

// Where a memory budget goes (DESIGN.md invariant 5): host memory on Cpu, VRAM on Cuda.
struct MemoryPlan {
  uint64_t dense = 0, kv = 0, activations = 0, pool = 0;
  int slots = 0;  // per MoE layer
  uint64_t fixed() const { return dense + kv + activations; }  // all but the pool
  uint64_t total() const { return fixed() + pool; }
};

class Model {
 public:
  // A Hugging Face checkpoint directory or an engine directory (moestream.json, written by
  // `moestream convert`).
  static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& opt = {});

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  State new_state() const { return State(cfg_, kv_positions_); }

  // Runs T tokens at the state's position through the model and advances the state; more than
  // prefill_chunk() tokens run chunk by chunk (next_chunk), their results joined.
  ForwardResult forward(const int* ids, int T, State& state, const ForwardOptions& opt = {}) const;
  // Tokens the next chunk of a prompt with `remaining` tokens still to run takes: prefill_chunk(),
  // or 64 fewer where that would leave one lone token (a lone token takes DeltaNet's recurrent
  // form, whose bits differ from the chunked form a whole prefill gives it), or all that remain.
  int next_chunk(int remaining) const;
  int prefill_chunk() const { return prefill_chunk_; }
  // Fails naming the first of ids outside the vocabulary and its position: what forward checks
  // before its first chunk runs, for a caller that runs a prompt chunk by chunk itself.
  void check_ids(const int* ids, int T) const;

  // Greedy decode steps on the GPU, each launched before the host reads the token of the one
  // before, so that the GPU never waits for the host between steps: `first` (a token the state
  // has not processed) and then each token picked (the first maximum of the logits, as a greedy
  // Sampler without penalties) go through the model, at most max_steps steps. on_step gets each
  // step's token (ForwardResult::token; with `routes` also its routes, as forward's, but no
  // router_probs) in turn and returns whether to go on; the step after the token it refuses has
  // run by then, so the state has processed every token on_step got but the last (and that one
  // too where it refused). Returns the steps run: the state advances by as many. Where
  // decodes_ahead().
  int decode_ahead(State& state, int first, int max_steps, bool routes,
                   const std::function<bool(const ForwardResult&)>& on_step) const;
  // Cuda with decode graphs (decode_graphs()) and the embedding table in VRAM: bf16 or affine (an
  // f32 one stays on the host), where it fits beside the expert pools (DeviceWeights::add_embedding).
  bool decodes_ahead() const;

  bool has_mtp() const { return w_.mtp != nullptr; }
  // MTP head over T rows: row i takes hidden[i] (the main model's hidden state at position
  // pos0 + i) and the embedding of next_ids[i] (the token at pos0 + i + 1), and predicts the
  // token at pos0 + i + 2. Uses and extends the state's MTP KV cache. Returns [T, vocab].
  std::vector<float> mtp_forward(const float* hidden, const int* next_ids, int T, int pos0, State& state) const;

  // The streaming expert store of an engine directory (on Cuda: the host tier below the VRAM
  // pool); null for a Hugging Face checkpoint.
  const ExpertStore* experts() const { return experts_.get(); }
  // The VRAM expert pool of an engine directory on Cuda; null otherwise.
  const DeviceExpertStore* device_experts() const { return device_experts_.get(); }
  // The pool the forward reads experts from: the VRAM pool on Cuda, else the host one.
  std::vector<LayerStats> pool_stats() const;
  size_t pool_bytes() const;
  const MemoryPlan& memory_plan() const { return plan_; }
  Device device() const { return device_ ? Device::Cuda : Device::Cpu; }
  // Whether decode steps run as CUDA graphs (ModelOptions::cuda_graphs, and every routed expert
  // resident in VRAM).
  bool decode_graphs() const { return decode_graphs_; }

 private:
  Model(TensorStore store, ModelConfig cfg, std::unique_ptr<ExpertStore> experts, MemoryPlan plan, int kv_positions,
        int prefill_chunk);
  static std::unique_ptr<Model> load_on_host(const std::string& dir, const ModelOptions& opt);
  void embed(const int* ids, int T, float* out) const;
  // The forward written once over a backend B (model/blocks.h): CpuBackend or CudaBackend.
  template <class B>
  ForwardResult forward_on(const B& be, const int* ids, int T, int pos0, const ForwardOptions& opt) const;
  // One chunk's forward (T <= prefill_chunk_) on the model's backend; advances the state.
  ForwardResult forward_chunk(const int* ids, int T, State& state, const ForwardOptions& opt) const;
  // The decoder layers over x [T, hidden] in place, and xn = final_norm(x) after them; each MoE
  // layer's routes into r with opt.routes.
  template <class B>
  void run_layers(const B& be, float* x, float* xn, int T, int pos0, const ForwardOptions& opt,
                  ForwardResult& r) const;
  // Where layer l's routes of T tokens go in r (r.routes and r.router_probs have a row per layer):
  // its ids and router probabilities, or nulls for a dense layer.
  std::pair<int*, float*> route_rows(ForwardResult& r, int l, int T) const;
  // The logits of the last `rows` rows of xn [T, hidden] (final_norm(x)).
  template <class B>
  void final_logits(const B& be, const float* xn, int T, int rows, float* logits) const;
  // A decode step (one token) as the sequence's CUDA graph, captured first where there is none
  // yet or the KV caches it holds have moved (Cuda builds; decode_graphs_).
  ForwardResult forward_captured(const CudaBackend& be, int id, int pos0, const ForwardOptions& opt) const;
  std::unique_ptr<DecodeGraph> capture_decode_step(const CudaBackend& be, int pos0,
                                                   std::vector<const float*> kv_at_capture, StepKind kind) const;
  // The KV caches' addresses for a decode step at pos0, each grown first where it must be.
  std::vector<const float*> decode_step_kv(DeviceState& ds, int pos0) const;
  // Captures the sequence's decode step anew unless its graph is of this kind and holds kv.
  void capture_if_stale(const CudaBackend& be, int pos0, std::vector<const float*> kv, StepKind kind) const;
  bool every_expert_resident() const;  // Cuda builds
  // One chunk of mtp_forward (T <= prefill_chunk_) on the model's backend.
  std::vector<float> mtp_chunk(const float* hidden, const int* next_ids, int T, int pos0, State& state) const;
  template <class B>
  std::vector<float> mtp_forward_on(const B& be, const float* hidden, const int* next_ids, int T, int pos0) const;
  template <class B>
  void decoder_layer(const B& be, const LayerWeights& lw, int T, typename B::KV& kv, typename B::Linear* lin, int pos0,
                     float* x, float* h, const std::vector<float>& next_norm, int* routes, float* router_probs) const;
  float norm_offset() const { return cfg_.zero_centred_norms() ? 1.f : 0.f; }  // what the norms' weights add to

  TensorStore store_;
  ModelConfig cfg_;
  std::unique_ptr<ExpertStore> experts_;  // engine directory: routed experts, streamed
  MemoryPlan plan_;
  ModelWeights w_;
  std::shared_ptr<const DeviceWeights> device_;  // the weights in VRAM on --device cuda, else null
  std::shared_ptr<DeviceExpertStore> device_experts_;  // after experts_: it borrows that store
  bool decode_graphs_ = false;  // Cuda: decode steps through forward_captured (ModelOptions::cuda_graphs)
  int kv_positions_ = 0;        // ModelOptions::context: what new states' KV caches plan for
  int prefill_chunk_ = kPrefillChunk;  // ModelOptions::prefill_chunk
};

}  // namespace ms
