#pragma once
// What runs a model on one device (backends/cpu, backends/cuda): a chunk's forward, the MTP head,
// and decode steps, each backend the fast way it has (the CUDA one replays a captured step and
// runs greedy steps ahead of the host). Model (model/model.h) holds one and keeps what is the
// same on every device (chunking, checks) in front of it.
#include <functional>
#include <string>
#include <vector>

#include "experts/expert_store.h"
#include "kernels/sampling.h"
#include "model/state.h"

namespace ms {

enum class Device { Cpu, Cuda };

struct ForwardOptions {
  bool all_logits = false;  // logits of every position, not only the last
  // false: no logits and no pick at all (a prompt's chunk before its last, whose logits no one reads)
  bool logits = true;
  bool hidden = false;      // keep the last hidden states (before and after the final norm)
  bool routes = false;      // keep the routed expert ids and router probabilities of every MoE layer
  // Speculative verification: every row gets the bits a one-token decode step would give it (the
  // linear-attention layers run their recurrent form token by token), and the state keeps each
  // token's linear-attention states (State::begin_steps / keep_steps). At most a prefill chunk.
  bool verify = false;
  // What the next token's pick needs (runtime's Sampler::next): where given, the backend picks it
  // from the last position's logits where they are (Backend::pick), so that only the token comes
  // back; ForwardResult::logits then stays empty unless all_logits.
  std::function<PickInputs()> pick;
  // Benchmarks' routing-trace replay: where given, layer l's routed ids ([T, top_k], an empty row
  // for a dense layer) replace its router's top-k, weighted by the router's probabilities of
  // those ids. Never a user-facing run: the answer is not the model's.
  const std::vector<std::vector<int>>* routes_from = nullptr;
};

struct ForwardResult {
  std::vector<float> logits;                // [all_logits ? T : 1, vocab]; empty with pick
  int token = -1;                           // what pick picked
  std::vector<float> hidden_pre_norm;       // [T, hidden]
  std::vector<float> hidden_post_norm;      // [T, hidden]
  std::vector<std::vector<int>> routes;       // [layer][T * top_k], empty for dense layers
  std::vector<std::vector<float>> router_probs;  // [layer][T * n_experts], empty for dense layers
};

// Decode steps (Model::decode): each runs one token and picks the next.
struct DecodeOptions {
  std::function<PickInputs()> pick;  // as ForwardOptions::pick; required
  // Whether every pick is the first maximum of the logits (runtime's Sampler::greedy): a
  // backend may then pick on the device without asking `pick`, and run steps ahead.
  bool greedy = false;
  bool routes = false;  // each step's routed ids (ForwardResult::routes; router_probs may stay empty)
};
// What a tier's load put in it: every expert, or warm start's hottest (--warm-start).
struct TierLoad {
  bool whole = false;
  int warmed = 0, pinned = 0;  // experts warm start read in, and of them pinned
  uint64_t bytes = 0;          // read (or copied) by the load
  double seconds = 0;
  double gb_s() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
  // The disk's rate as the load measured it, where it read enough to tell (256 MiB), else 0.
  double measured_read_gb_s() const { return bytes >= (uint64_t(256) << 20) ? gb_s() : 0.0; }
};

// One tier of a backend's expert pools, for --stats, /api/stats and /metrics: a title naming
// it, its layers' statistics, what their byte and time columns count ("read" from disk, "copy"
// to VRAM), the rate of that link measured at start (0 where not measured) and its load.
struct PoolTier {
  std::string title;
  std::vector<LayerStats> layers;
  const char* moves = "read";
  const char* name = "ram";  // "vram", "host" (the GPU's host tier) or "ram" (the CPU's pools)
  double measured_gb_s = 0;
  TierLoad load;
  std::string placement;  // the VRAM tier's: where a decode token's misses run (--cpu-experts)
};

// Gets each step's result (its token picked) in turn; returns whether to run another step.
using OnStep = std::function<bool(const ForwardResult&)>;

class Executor {
 public:
  virtual ~Executor() = default;
  virtual Device device() const = 0;
  // T tokens (at most the model's prefill chunk) at the state's position; does not advance it.
  virtual ForwardResult forward(const int* ids, int T, State& state, const ForwardOptions& opt) const = 0;
  // Model::decode's steps, first the token `first`; returns the steps run, by which it advanced
  // the state (a backend that runs ahead may have run the step after the one on_step refused).
  virtual int decode(State& state, int first, int max_steps, const DecodeOptions& opt, const OnStep& on_step) const = 0;
  // The MTP head over T rows (Model::mtp_forward), at most a prefill chunk of them.
  virtual std::vector<float> mtp(const float* hidden, const int* next_ids, int T, int pos0, State& state,
                                 std::vector<float>* hidden_out, int logit_rows) const = 0;
  // The expert pool the forward reads from (the VRAM pool on the GPU), and its bytes.
  virtual std::vector<LayerStats> pool_stats() const = 0;
  virtual size_t pool_bytes() const = 0;
  // Every tier of expert pools, the one the forward reads first; empty where nothing streams.
  virtual std::vector<PoolTier> pool_tiers() const = 0;

 protected:
  // decode() as a forward of one token a step, the next token picked from its logits.
  int decode_stepwise(State& state, int first, int max_steps, const DecodeOptions& opt, const OnStep& on_step) const;
};

}  // namespace ms
