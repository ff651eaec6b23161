#include "server/metrics.h"

#include <fmt/format.h>

#include <iterator>

namespace ms {

namespace {

class Writer {
 public:
  // One metric family: its HELP and TYPE lines, then samples.
  void family(const char* name, const char* type, const char* help) {
    fmt::format_to(std::back_inserter(out_), "# HELP moestream_{} {}\n# TYPE moestream_{} {}\n", name, help, name, type);
  }
  void sample(const char* name, double v, const std::string& labels = "") {
    fmt::format_to(std::back_inserter(out_), "moestream_{}{}{}{} {}\n", name, labels.empty() ? "" : "{", labels,
                   labels.empty() ? "" : "}", v);
  }
  void metric(const char* name, const char* type, const char* help, double v) {
    family(name, type, help);
    sample(name, v);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

double mean(const std::vector<RequestRecord>& recent, double RequestRecord::*field) {
  double sum = 0;
  for (const auto& r : recent) sum += r.*field;
  return recent.empty() ? 0 : sum / double(recent.size());
}

// Per tier of the expert pools (label tier="vram", "host" or "ram"): what moved in and how fast.
void tier_metrics(Writer& w, const std::vector<TierSummary>& tiers) {
  if (tiers.empty()) return;
  struct Family {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const TierSummary&);
  };
  static const Family families[] = {
      {"tier_hits_total", "counter", "Routed experts found resident in the tier.",
       [](const TierSummary& t) { return double(t.pool.hits); }},
      {"tier_misses_total", "counter", "Routed experts the tier had to move in.",
       [](const TierSummary& t) { return double(t.pool.misses); }},
      {"tier_bytes_total", "counter", "Expert bytes moved into the tier (copies to VRAM, reads from disk).",
       [](const TierSummary& t) { return double(t.pool.bytes_read); }},
      {"tier_move_seconds_total", "counter", "Time the tier's copies or reads were in flight.",
       [](const TierSummary& t) { return t.pool.read_s; }},
      {"tier_stall_seconds_total", "counter", "Time the compute waited for the tier's copies or reads.",
       [](const TierSummary& t) { return t.pool.stall_s; }},
      {"tier_measured_gbps", "gauge", "The tier's link rate measured at start, GB/s (0: not measured).",
       [](const TierSummary& t) { return t.measured_gb_s; }},
      {"tier_prefetch_used_total", "counter", "Predicted experts moved ahead into the tier that routing asked for.",
       [](const TierSummary& t) { return double(t.prefetch.used); }},
      {"tier_prefetch_wasted_total", "counter", "Predicted experts moved ahead into the tier and dropped unused.",
       [](const TierSummary& t) { return double(t.prefetch.wasted); }},
      {"tier_prefetch_for_cpu_total", "counter",
       "Predicted experts left in host memory for the CPU to compute (the hybrid decode), not copied.",
       [](const TierSummary& t) { return double(t.prefetch.for_cpu); }},
      {"tier_load_seconds", "gauge", "Seconds the load took to fill the tier (every expert, or warm start).",
       [](const TierSummary& t) { return t.load.seconds; }},
  };
  for (const Family& f : families) {
    w.family(f.name, f.type, f.help);
    for (const TierSummary& t : tiers) w.sample(f.name, f.value(t), fmt::format("tier=\"{}\"", t.name));
  }
  for (const TierSummary& t : tiers) {
    if (t.placement.empty()) continue;  // only the VRAM tier places its misses
    const PlacementStats& p = t.placed;
    w.family("experts_placed_total", "counter",
             "Routed experts of decode steps by where they ran: in VRAM, copied to VRAM, or on the CPU.");
    w.sample("experts_placed_total", double(p.gpu), "where=\"gpu\"");
    w.sample("experts_placed_total", double(p.copied), "where=\"copied\"");
    w.sample("experts_placed_total", double(p.cpu), "where=\"cpu\"");
    w.metric("hybrid_cpu_busy_seconds_total", "counter", "Time the CPU computed experts beside the GPU.", p.cpu_busy_s);
    w.metric("hybrid_cpu_wait_seconds_total", "counter", "Time the host waited for the GPU to reach a layer's routing.",
             p.cpu_wait_s);
    w.metric("hybrid_gpu_wait_seconds_total", "counter", "Time the GPU waited for the CPU's experts.", p.gpu_wait_s);
  }
}

}  // namespace

std::string prometheus_text(const StatsSnapshot& s, const QueueState& q, const HttpCounters& http) {
  Writer w;
  w.metric("uptime_seconds", "gauge", "Seconds since the server started.", s.uptime_s);
  w.metric("requests_served_total", "counter", "Generation requests finished, whatever the reason.", double(s.requests_served));
  w.metric("requests_cancelled_total", "counter", "Requests cancelled (client gone or server stopping).", double(s.requests_cancelled));
  w.metric("requests_timed_out_total", "counter", "Requests cut off at --request-timeout.", double(s.requests_timed_out));
  w.metric("requests_rejected_total", "counter", "Requests refused because the queue was full.", double(s.requests_rejected));
  w.metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", double(s.prompt_tokens));
  w.metric("reused_prompt_tokens_total", "counter", "Prompt tokens served from the conversation cache.", double(s.reused_tokens));
  w.metric("completion_tokens_total", "counter", "Generated tokens.", double(s.completion_tokens));
  w.metric("recent_decode_tokens_per_second", "gauge", "Mean decode speed of the last requests.",
           mean(s.recent, &RequestRecord::decode_tok_s));
  w.metric("recent_prefill_tokens_per_second", "gauge", "Mean prompt processing speed of the last requests.",
           mean(s.recent, &RequestRecord::prefill_tok_s));
  w.metric("queue_waiting", "gauge", "Requests waiting for the generation thread.", double(q.waiting));
  w.metric("queue_limit", "gauge", "Most requests that may wait (--queue-limit).", double(q.limit));
  w.metric("queue_running", "gauge", "Requests generating now (0 or 1).", q.running ? 1 : 0);
  w.metric("http_connections_open", "gauge", "Client connections open now.", double(http.open));
  w.metric("http_connections_accepted_total", "counter", "Client connections taken.", double(http.accepted));
  w.metric("http_connections_refused_total", "counter",
           "Client connections refused over --max-connections or --max-client-connections.", double(http.refused));
  w.metric("http_timeouts_total", "counter", "Connections closed at a head, body or write deadline.", double(http.timed_out));
  w.metric("http_rejected_total", "counter", "Requests refused by the HTTP layer (malformed, too large, encoded, no route).",
           double(http.rejected));

  w.metric("warm_start_experts", "gauge", "Experts read into the pools at load by warm start (pinned ones included).",
           double(s.warm.warmed));
  w.metric("warm_start_pinned_experts", "gauge", "Experts warm start pinned.", double(s.warm.pinned));
  w.metric("loaded_whole", "gauge", "1 where every expert was read into the pools at load.", s.warm.loaded_whole ? 1 : 0);
  w.metric("first_tokens_hit_rate", "gauge", "The pools' hit rate over the first tokens after start (first_tokens).",
           s.early.pool.hit_rate());
  const SpeculativeStats& sp = s.speculative;
  w.metric("speculative_verifies_total", "counter", "Verify forwards of MTP drafts.", double(sp.verifies));
  w.metric("speculative_drafted_tokens_total", "counter", "Tokens the MTP head drafted.", double(sp.drafted));
  w.metric("speculative_accepted_tokens_total", "counter", "Drafted tokens the sampler kept.", double(sp.accepted));
  w.metric("speculative_plain_steps_total", "counter", "One-token decode steps of speculating requests (K = 0).",
           double(sp.plain_steps));
  w.metric("speculative_tokens_per_forward", "gauge", "Tokens made per forward of the main model while speculating.",
           sp.tokens_per_forward());
  w.metric("speculative_draft", "gauge", "Drafts per verify (K) of the last step.", double(sp.draft));

  w.family("resident_bytes", "gauge", "Bytes held in memory, by kind.");
  w.sample("resident_bytes", double(s.resident.dense), "kind=\"dense\"");
  w.sample("resident_bytes", double(s.resident.experts), "kind=\"experts\"");
  w.sample("resident_bytes", double(s.resident.state), "kind=\"state\"");
  w.metric("kv_cache_bytes", "gauge", "Bytes the serving session's KV caches hold.", double(s.kv.bytes));
  w.metric("kv_cache_bytes_per_position", "gauge", "KV cache bytes one position takes in every attention layer.",
           double(s.kv.bytes_per_position));

  w.family("layer_routed_total", "counter", "Expert routings (token x top-k) per MoE layer.");
  for (const LayerUsage& l : s.layers)
    if (l.moe) w.sample("layer_routed_total", double(l.routed_total), fmt::format("layer=\"{}\"", l.layer));
  w.family("expert_routed_total", "counter", "Tokens routed to each expert of each MoE layer.");
  for (const LayerUsage& l : s.layers)
    for (size_t e = 0; e < l.routed.size(); ++e)
      w.sample("expert_routed_total", double(l.routed[e]), fmt::format("layer=\"{}\",expert=\"{}\"", l.layer, e));
  w.family("pool_slots", "gauge", "Expert pool slots per MoE block (streamed models).");
  for (const LayerStats& l : s.pool) w.sample("pool_slots", double(l.capacity), fmt::format("layer=\"{}\"", l.name));
  w.family("pool_resident_experts", "gauge", "Experts resident in the pool.");
  for (const LayerStats& l : s.pool) w.sample("pool_resident_experts", double(l.resident), fmt::format("layer=\"{}\"", l.name));
  w.family("pool_hits_total", "counter", "Routed experts found resident.");
  for (const LayerStats& l : s.pool) w.sample("pool_hits_total", double(l.pool.hits), fmt::format("layer=\"{}\"", l.name));
  w.family("pool_misses_total", "counter", "Routed experts read from disk.");
  for (const LayerStats& l : s.pool) w.sample("pool_misses_total", double(l.pool.misses), fmt::format("layer=\"{}\"", l.name));
  w.family("pool_bytes_read_total", "counter", "Expert bytes read from disk.");
  for (const LayerStats& l : s.pool) w.sample("pool_bytes_read_total", double(l.pool.bytes_read), fmt::format("layer=\"{}\"", l.name));
  w.family("pool_stall_seconds_total", "counter", "Time the compute waited for expert reads.");
  for (const LayerStats& l : s.pool) w.sample("pool_stall_seconds_total", l.pool.stall_s, fmt::format("layer=\"{}\"", l.name));
  tier_metrics(w, s.tiers);
  if (const PrefetchReport& p = s.prefetch; p.on) {
    w.metric("prefetch_width", "gauge", "Experts a prediction names now.", double(p.width));
    w.metric("prefetch_staging_bytes", "gauge", "Bytes of the staging area prefetch reads land in.", double(p.staging_bytes));
    w.metric("prefetch_predicted_total", "counter", "Experts named by predictions.", double(p.counts.predicted));
    w.metric("prefetch_read_ahead_total", "counter", "Predicted experts read into staging.", double(p.counts.issued));
    w.metric("prefetch_used_total", "counter", "Staged experts that routing asked for (misses avoided).", double(p.counts.used));
    w.metric("prefetch_wasted_total", "counter", "Staged experts dropped without use.", double(p.counts.wasted));
    w.metric("prefetch_recall", "gauge", "Misses avoided over misses without prefetch.", p.summary.recall);
    w.metric("prefetch_demand_misses_total", "counter", "Misses left to demand reads.", double(p.summary.demand_misses));
    w.metric("prefetch_stall_seconds_total", "counter", "Time the compute waited on expert reads.", p.stall_s);
  }
  return w.take();
}

}  // namespace ms
