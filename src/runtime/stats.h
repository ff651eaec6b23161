#pragma once
// The engine's health as a front end reports it (serve's /api/stats and /metrics): expert
// routing per layer, resident memory, recent request speeds, totals. Thread-safe: the
// generation thread records while HTTP threads read snapshots.
//
// A streamed model's pool numbers (occupancy, hits, misses, bytes read, stall time) come from
// its expert pool (Model::pool_stats: the VRAM pool on CUDA), the same numbers `--stats` prints.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/config.h"
#include "model/model.h"
#include "runtime/speculative.h"

namespace ms {

struct LayerUsage {
  int layer = 0;
  bool moe = false;
  std::vector<uint64_t> routed;  // [n_experts]: tokens routed to each expert so far
  uint64_t routed_total = 0;
};

struct ResidentBytes {
  size_t dense = 0;    // non-expert weights
  size_t experts = 0;  // routed expert weights held in memory (a streamed model: its pool slots)
  size_t state = 0;    // KV cache and linear-attention state
};

// The KV cache (--kv-bits): its format, what a position takes in it (and in float32), and what
// the serving session's caches hold.
struct KvReport {
  std::string format = "float32";
  uint64_t bytes_per_position = 0, float32_bytes_per_position = 0;
  size_t bytes = 0;
  int positions = 0;
};

struct RequestRecord {
  int prompt_tokens = 0, reused_tokens = 0, completion_tokens = 0;
  double prefill_tok_s = 0, decode_tok_s = 0, time_to_first_token_s = 0;
  std::string finish_reason;
};

// The prefetcher of the host's expert store (experts/prefetch.h), where it runs.
struct PrefetchReport {
  bool on = false;
  int width = 0;
  double mean_width = 0;
  int staging_buffers = 0;
  size_t staging_bytes = 0;
  PrefetchStats counts;     // summed over layers
  PrefetchSummary summary;  // against the host pool's misses
  double stall_s = 0;       // the host pool's: compute waiting on reads
  IoCounters io;            // the disk engine: reads, bytes, busy time
};
// The prefetch report of a model's host store (off where there is none, or it does not prefetch).
PrefetchReport prefetch_report(const Model& model);

// One tier of the expert pools (Executor::pool_tiers), summed over its layers: VRAM (copies from
// the host tier), the GPU's host tier or the CPU's pools (reads from disk).
struct TierSummary {
  std::string name, moves;      // PoolTier's
  int slots = 0, resident = 0;  // over layers
  PoolStats pool;
  PrefetchStats prefetch;          // predicted experts moved ahead into this tier's staging
  PrefetchSummary prefetch_summary;
  double measured_gb_s = 0;  // the link's rate measured at start; 0 where not measured
  TierLoad load;
  std::string placement;  // PoolTier's: where the VRAM tier's misses run ("" elsewhere)
  PlacementStats placed;  // over layers
  double gb_s() const { return pool.read_s > 0 ? double(pool.bytes_read) / pool.read_s / 1e9 : 0.0; }
  // The share of the moves' time the compute did not wait for (1: hidden behind compute).
  double overlap() const { return pool.read_s > 0 ? std::max(0.0, 1.0 - pool.stall_s / pool.read_s) : 0.0; }
};
TierSummary summarize_tier(const PoolTier& t);

struct StatsSnapshot {
  double uptime_s = 0;
  uint64_t requests_served = 0;  // finished, whatever the reason
  uint64_t requests_cancelled = 0, requests_timed_out = 0, requests_rejected = 0;
  uint64_t prompt_tokens = 0, reused_tokens = 0, completion_tokens = 0;
  // Tokens of the forwards so far, counted as each one's routes are recorded (live, where the
  // request totals above count at a request's end): prompt chunks, and single-token steps.
  uint64_t forwarded_prompt = 0, forwarded_steps = 0;
  ResidentBytes resident;
  std::vector<LayerUsage> layers;
  std::vector<LayerStats> pool;  // per MoE block of a streamed model; empty otherwise
  std::vector<TierSummary> tiers;  // VRAM over the host tier (CUDA), or the pools (CPU)
  std::vector<PoolTier> pool_tiers;  // the same tiers layer by layer, with where each expert is
  PrefetchReport prefetch;
  KvReport kv;
  WarmReport warm;             // what the load put in the pools
  ExpertStore::Early early;    // the pools' hits over the first tokens after start
  SpeculativeOptions speculative_default;  // what requests speculate with unless they ask otherwise
  SpeculativeStats speculative;            // summed over requests
  std::vector<RequestRecord> recent;  // the last few requests, oldest first
};

class EngineStats {
 public:
  static constexpr size_t kRecent = 16;

  EngineStats(const ModelConfig& cfg, ResidentBytes weights, const Model* model = nullptr);

  // routes[layer] holds T * top_k expert ids (empty for dense layers), as ForwardResult has them.
  void record_routes(const std::vector<std::vector<int>>& routes);
  void record_request(const RequestRecord& r);
  void record_rejected();
  void record_speculative(const SpeculativeStats& s);
  void set_speculative_default(const SpeculativeOptions& o);
  // The session's state: all it holds, its KV caches' share and their positions.
  void set_state_bytes(size_t bytes, size_t kv_bytes = 0, int positions = 0);

  StatsSnapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  StatsSnapshot s_;
  std::deque<RequestRecord> recent_;
  const Model* model_;
  int top_k_;
};

nlohmann::ordered_json to_json(const StatsSnapshot& s);

}  // namespace ms
