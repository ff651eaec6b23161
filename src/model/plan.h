#pragma once
// What a load is asked for (ModelOptions) and where each budget goes (MemoryPlan): --memory on
// the CPU, --vram and --host-cache on the GPU, --context and the prefill chunk on both. Every
// budget and the per-layer slot counts of the expert pools are worked out here, once.
#include <cstdint>
#include <optional>
#include <string>

#include "experts/expert_store.h"
#include "format/config.h"
#include "format/engine_dir.h"
#include "model/executor.h"
#include "quant/kv_quant.h"
#include "util/memory.h"

namespace ms {

// Tokens a prompt's forward runs at once by default (ModelOptions::prefill_chunk): a multiple of
// the DeltaNet kernels' 64-token chunk, so that a chunked prefill gives a whole one's bits.
constexpr int kPrefillChunk = 512;
constexpr int kPrefillChunkAlign = 64;

// MTP self-speculative decoding (runtime/speculative.h): off, or drafts by the model's MTP head,
// `draft` of them per verify (1..kMaxDraft) or chosen per step from measurements (kDraftAuto).
// `automatic` (--speculative auto) asks for MTP drafts where the model has a head that runs on
// its device, and plain decoding elsewhere: resolve_speculative settles it.
constexpr int kMaxDraft = 4;
constexpr int kDraftAuto = -1;
struct SpeculativeOptions {
  bool mtp = false;
  bool automatic = false;
  int draft = kDraftAuto;
};

// What an engine directory's pools hold before the first token (--warm-start): nothing, or each
// layer's hottest experts by the usage history, as residents the policy may evict (Auto) or
// pinned (Pin).
enum class WarmStart { Off, Auto, Pin };

// How an engine directory's experts are held: a pool of `experts.slots` per layer (or per-layer
// caps), or sized from a memory budget. A Hugging Face checkpoint keeps every expert mapped.
// On Cuda the pools are in VRAM (`experts` or `vram_budget` sizes them) over a host tier.
struct ModelOptions {
  StoreOptions experts;
  uint64_t memory_budget = 0;  // Cpu: bytes for everything (dense + KV + activations + pool); 0 = unset
  // Cpu, no memory_budget: what the process may use (default_host_budget() where unset); pools
  // are sized to it where the model does not fit, and a run that cannot fit is refused.
  std::optional<HostBudget> host_budget;
  int context = 4096;          // tokens the KV budget provides for
  bool context_given = false;  // asked for (--context): a default budget does not shrink it
  KvFormat kv;                 // how the KV caches store keys and values (--kv-bits, --kv-group, --kv-rotation)
  // Most tokens one forward runs at once: longer prompts go through in chunks (Model::next_chunk)
  // whose activations the memory plan counts. A multiple of kPrefillChunkAlign, at least twice it.
  int prefill_chunk = kPrefillChunk;
  // Cuda: dense weights in VRAM, the forward on the GPU (builds with the CUDA backend).
  Device device = Device::Cpu;
  uint64_t vram_budget = 0;  // Cuda: VRAM for dense + KV + activations + pool; 0 = unset
  uint64_t host_cache = 0;   // Cuda: host RAM caching experts between SSD and VRAM; 0 = staging only
  bool host_cache_auto = false;  // Cuda: size it from the memory the process may use (--host-cache auto)
  PolicyKind host_policy = PolicyKind::LRU;
  // Cuda: run each decode step as a CUDA graph, captured once per sequence, where every routed
  // expert is resident in VRAM (a step then has no host round trip until the sampled token).
  bool cuda_graphs = true;
  // Cuda: where the VRAM misses of a decode token run (--cpu-experts; experts/placement.h). Off
  // until auto is measured against it on a GPU (docs/gpu.md).
  CpuExperts cpu_experts{.mode = CpuExperts::Mode::Off};
  // The default for every generation (a server request may ask otherwise); with mtp on the plan
  // counts the linear-attention states a verify keeps per drafted token.
  SpeculativeOptions speculative;
  // The usage history (experts/usage.h): "off", "" where it lives by default
  // (default_usage_path; the CLI's default), or a file.
  std::string usage = "off";
  WarmStart warm_start = WarmStart::Pin;  // pin won bench/warm_start_bench.sh (docs/PERFORMANCE.md)
  double warm_fraction = 0.5;  // of each pool's slots that warm start fills
  // Where the pools hold every expert and the memory available does too, read them all at load.
  bool load_whole = true;
  std::string pool_profile;  // the file experts.layer_caps and pins came from, for reports; "" for none
  bool progress = false;     // a progress bar on stderr for the reads at load
};

// Where a memory budget goes (docs/ARCHITECTURE.md, invariant 5): host memory on Cpu, VRAM on Cuda.
struct MemoryPlan {
  uint64_t dense = 0, kv = 0, activations = 0, staging = 0, pool = 0;  // staging: prefetch reads land there
  // Host budgets: what the process holds beside the rest (code and library pages, thread stacks,
  // the tokenizer, allocator slack); see process_reserve.
  uint64_t process = 0;
  int slots = 0;            // per MoE layer; 0 where the budget sized no pool (everything fits)
  uint64_t budget = 0;      // the budget planned for; 0 where there is none
  std::string source;       // where the budget came from: "--memory", "the cgroup memory limit (...) less 5 %"
  int context = 0;          // the tokens of KV planned for, and the prefill chunk's tokens: the options',
  int prefill_chunk = 0;    // or less where a default budget could not hold those
  int staging_buffers = 0;  // of `staging`
  uint64_t fixed() const { return process + dense + kv + activations + staging; }  // all but the pool
  uint64_t total() const { return fixed() + pool; }
};

// The plan in one line, for --stats: "memory budget 38.0 MiB from the cgroup memory limit (...)
// less 5 %: dense 12.0 MiB, KV/state ..." ("VRAM budget" on Cuda); empty where there is no budget.
std::string describe(const MemoryPlan& plan, Device device);

// The process's share of a host budget for a model directory: a fixed reserve for code pages,
// stacks, I/O rings and allocator slack, and the tokenizer file's size for its parsed tables.
uint64_t process_reserve(const std::string& dir);

// The host tier's plan on Cuda (host_store_options), in one line for --stats: "host tier: 30.1
// GiB of expert records, 512 slots a layer, ... (--host-cache auto: ... from MemAvailable ...)".
std::string describe_host_tier(const MemoryPlan& host_plan);

// Fails unless chunk is a multiple of kPrefillChunkAlign and at least twice it.
void check_prefill_chunk(int chunk);

// The bytes of the staging area prefetch reads land in where prefetch runs with `slots` a layer
// (model/predict.h; off, or auto where every expert is resident: none).
uint64_t staging_bytes(const PrefetchOptions& p, const ModelConfig& cfg, const EngineIndex& index, int slots);

// The CPU's plan of an engine directory: of --memory (refused above the cgroup limit), else of
// the budget the process may use (ModelOptions::host_budget) where the model does not fit it
// whole; a plan with no slots where it does (its budget and source say what was checked).
MemoryPlan plan_host_memory(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index, uint64_t dense_bytes,
                            const ModelOptions& opt);

// The options of the host's expert store of an engine directory, and its plan: on the CPU
// plan_host_memory's (the pools' slots from the budget); on Cuda the host tier under the VRAM
// pool (--host-cache's slots, auto: from the memory the process may use, or staging for one
// token), whose plan describe_host_tier reports.
StoreOptions host_store_options(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index,
                                uint64_t dense_bytes, const ModelOptions& opt, MemoryPlan& plan);

// The plan of a checkpoint directory under a budget (`what`: "memory budget", "VRAM budget"):
// its experts are dense weights, and a budget below them all is refused with the way out.
MemoryPlan plan_checkpoint(const std::string& dir, const ModelConfig& cfg, uint64_t weight_bytes, uint64_t budget,
                           const ModelOptions& opt, const char* what);

// The VRAM pool's options over an engine directory's experts, and the plan of the VRAM: from
// --vram, or (unsized) every expert where they fit in `free_vram`, else the pools get that.
// dense_bytes: the dense weights in VRAM. --prefetch auto is off for the VRAM pools (on asks).
StoreOptions vram_store_options(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index,
                                uint64_t dense_bytes, uint64_t free_vram, const ModelOptions& opt, MemoryPlan& plan);

}  // namespace ms
