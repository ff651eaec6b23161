#pragma once
// A loaded model (Qwen3-MoE or Qwen3-Next): its config, weights and streamed experts, and the
// Executor that runs it on a device. backends/load.h loads one; what is the same on every
// device (prompts in chunks, id checks) is here, in front of the executor.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/config.h"
#include "experts/usage.h"
#include "format/safetensors.h"
#include "model/executor.h"
#include "model/plan.h"
#include "model/state.h"
#include "model/weights.h"

namespace ms {

// What a load did to an engine directory's pools before the first token (--stats, /api/stats).
struct WarmReport {
  std::string usage_path;  // the usage history's file; "" where --usage off
  std::string note;        // why the history was ignored, or the model not loaded whole; "" if neither
  std::string profile;     // the pool profile used; "" for none
  bool loaded_whole = false;
  WarmStart mode = WarmStart::Off;  // as asked
  int warmed = 0;                   // experts warm start read in (pinned ones included) ...
  int pinned = 0;                   // ... of them pinned
  double seconds = 0;               // the load's expert reads
  uint64_t bytes = 0;               // ... and their bytes
  // As a tier's load (the host's pools: the CPU's, or the GPU's host tier).
  TierLoad tier_load() const { return {loaded_whole, warmed, pinned, bytes, seconds}; }
};

// "pools at load: loaded whole in 3.2 s; usage history usage.json; pool profile none" and the like.
std::string describe(const WarmReport& w);
const char* warm_start_name(WarmStart w);  // "off", "auto", "pin"

class Model {
 public:
  // The host side of a load: the config, the weights (mapped), an engine directory's expert
  // store, the CPU's memory plan (or the host tier's options on Cuda). attach() completes it.
  static std::unique_ptr<Model> open(const std::string& dir, const ModelOptions& opt);
  // The executor that runs the model, and the plan of the memory it runs in where that is not
  // the host's (the VRAM's on Cuda).
  void attach(std::unique_ptr<Executor> executor);
  void set_memory_plan(const MemoryPlan& plan) { plan_ = plan; }

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  State new_state() const { return State(cfg_, kv_positions_, kv_format_); }
  const KvFormat& kv_format() const { return kv_format_; }
  // Bytes one position takes in the KV caches of every full-attention layer and the MTP head's
  // (where the model has one), in `f` (default: the model's format).
  uint64_t kv_bytes_per_position(const KvFormat* f = nullptr) const;

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

  // Decode steps: `first` (a token the state has not processed) and then each token picked go
  // through the model, one a step, at most max_steps steps. on_step gets each step's result (its
  // token; with opt.routes its routed ids) in turn and returns whether to go on. Returns the
  // steps run: the state advances by as many. The state has processed every token on_step got
  // but the last; where the backend runs ahead (the GPU's greedy steps), the last too when
  // on_step refused it.
  int decode(State& state, int first, int max_steps, const DecodeOptions& opt, const OnStep& on_step) const;

  bool has_mtp() const { return w_.mtp != nullptr; }
  // MTP head over T rows: row i takes hidden[i] (the main model's hidden state at position
  // pos0 + i) and the embedding of next_ids[i] (the token at pos0 + i + 1), and predicts the
  // token at pos0 + i + 2. Uses and extends the state's MTP KV cache. Returns [T, vocab], or the
  // logits of the last logit_rows rows only (0: none) where logit_rows >= 0; hidden_out, where
  // given, gets the head's hidden states [T, hidden] before its final norm.
  std::vector<float> mtp_forward(const float* hidden, const int* next_ids, int T, int pos0, State& state,
                                 std::vector<float>* hidden_out = nullptr, int logit_rows = -1) const;

  // What the load put in the pools (WarmReport), and the usage history: this run's routings
  // merged into the history read at load (decayed) and written back atomically (save_usage;
  // nothing where --usage off, nothing streams, or nothing was routed). Throws naming the file.
  const WarmReport& warm_report() const { return warm_; }
  // The experts warm start reads into each expert layer's pool, hottest first, from the usage
  // history read at load: --warm-fraction of its free slots (less a token's experts where
  // pinning); empty lists with --warm-start off or no history. The CUDA backend's VRAM pools
  // take it too.
  std::vector<std::vector<int>> warm_set(const std::function<int(int layer)>& free_capacity,
                                         const ModelOptions& opt) const;
  void save_usage() const;

  // The streaming expert store of an engine directory (on Cuda: the host tier below the VRAM
  // pool); null for a Hugging Face checkpoint.
  ExpertStore* experts() const { return experts_.get(); }
  const Executor& executor() const { return *executor_; }
  // The pool the forward reads experts from: the VRAM pool on Cuda, else the host one.
  std::vector<LayerStats> pool_stats() const { return executor_->pool_stats(); }
  size_t pool_bytes() const { return executor_->pool_bytes(); }
  const MemoryPlan& memory_plan() const { return plan_; }
  // The host's plan: memory_plan() on the CPU, the host tier's on Cuda (describe_host_tier).
  const MemoryPlan& host_memory_plan() const { return host_plan_; }
  Device device() const { return executor_->device(); }

 private:
  Model(TensorStore store, ModelConfig cfg, std::unique_ptr<ExpertStore> experts, MemoryPlan plan, int kv_positions,
        int prefill_chunk);
  // Reads the usage history, then loads every expert where the pools and the memory hold them
  // all, else warm-starts the pools from the history (opt.warm_start).
  void prepare_pools(const std::string& dir, const ModelOptions& opt);
  // The dense weights as loaded against the index's checksums; a note on stderr for a version-1
  // directory, which has none.
  static void check_dense(const std::string& dir, const SafetensorsFile& dense, const EngineIndex& index);
  void read_usage_history(const std::string& dir, const ModelOptions& opt);
  bool load_whole(const ModelOptions& opt);  // whether it did; warm_.note says why not where it could not
  void warm_from_usage(const ModelOptions& opt);

  TensorStore store_;
  ModelConfig cfg_;
  std::unique_ptr<ExpertStore> experts_;  // engine directory: routed experts, streamed
  MemoryPlan plan_;
  MemoryPlan host_plan_;
  ModelWeights w_;
  std::unique_ptr<Executor> executor_;  // after experts_ and w_: it borrows them
  int kv_positions_ = 0;                // ModelOptions::context: what new states' KV caches plan for
  KvFormat kv_format_;                  // ModelOptions::kv
  int prefill_chunk_ = kPrefillChunk;   // ModelOptions::prefill_chunk
  WarmReport warm_;
  UsageHistory usage_base_;  // the history read at load
};

}  // namespace ms
