#include "runtime/stats.h"

#include "util/error.h"

namespace ms {

using ojson = nlohmann::ordered_json;

EngineStats::EngineStats(const ModelConfig& cfg, ResidentBytes weights, const Model* model)
    : start_(std::chrono::steady_clock::now()), model_(model), top_k_(std::max(1, cfg.top_k)) {
  s_.resident = weights;
  s_.layers.resize(size_t(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerUsage& ls = s_.layers[size_t(l)];
    ls.layer = l;
    ls.moe = cfg.is_moe(l);
    if (ls.moe) ls.routed.assign(size_t(cfg.n_experts), 0);
  }
  if (model) {
    const KvFormat f32;
    s_.kv.format = model->kv_format().describe();
    s_.kv.bytes_per_position = model->kv_bytes_per_position();
    s_.kv.float32_bytes_per_position = model->kv_bytes_per_position(&f32);
  }
}

void EngineStats::record_routes(const std::vector<std::vector<int>>& routes) {
  std::lock_guard lock(mu_);
  for (const std::vector<int>& r : routes)
    if (!r.empty()) {  // the first MoE layer's: the forward's tokens
      const uint64_t T = r.size() / size_t(top_k_);
      (T == 1 ? s_.forwarded_steps : s_.forwarded_prompt) += T;
      break;
    }
  for (size_t l = 0; l < routes.size() && l < s_.layers.size(); ++l) {
    LayerUsage& ls = s_.layers[l];
    for (int e : routes[l]) {
      if (e < 0 || size_t(e) >= ls.routed.size()) fail("layer {}: routed expert id {} out of range", l, e);
      ++ls.routed[size_t(e)];
    }
    ls.routed_total += routes[l].size();
  }
}

void EngineStats::record_request(const RequestRecord& r) {
  std::lock_guard lock(mu_);
  ++s_.requests_served;
  if (r.finish_reason == "cancelled") ++s_.requests_cancelled;
  if (r.finish_reason == "timeout") ++s_.requests_timed_out;
  s_.prompt_tokens += uint64_t(r.prompt_tokens);
  s_.reused_tokens += uint64_t(r.reused_tokens);
  s_.completion_tokens += uint64_t(r.completion_tokens);
  recent_.push_back(r);
  if (recent_.size() > kRecent) recent_.pop_front();
}

void EngineStats::record_rejected() {
  std::lock_guard lock(mu_);
  ++s_.requests_rejected;
}

void EngineStats::record_speculative(const SpeculativeStats& s) {
  std::lock_guard lock(mu_);
  s_.speculative.add(s);
}

void EngineStats::set_speculative_default(const SpeculativeOptions& o) {
  std::lock_guard lock(mu_);
  s_.speculative_default = o;
}

void EngineStats::set_state_bytes(size_t bytes, size_t kv_bytes, int positions) {
  std::lock_guard lock(mu_);
  s_.resident.state = bytes;
  s_.kv.bytes = kv_bytes;
  s_.kv.positions = positions;
}

StatsSnapshot EngineStats::snapshot() const {
  std::lock_guard lock(mu_);
  StatsSnapshot out = s_;
  out.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  out.recent.assign(recent_.begin(), recent_.end());
  if (model_ && model_->experts()) {
    out.pool_tiers = model_->executor().pool_tiers();
    if (!out.pool_tiers.empty()) out.pool = out.pool_tiers.front().layers;  // Model::pool_stats()'s
    for (const PoolTier& t : out.pool_tiers) out.tiers.push_back(summarize_tier(t));
    out.resident.experts = model_->pool_bytes();
    out.prefetch = prefetch_report(*model_);
    out.warm = model_->warm_report();
    out.early = model_->experts()->early();
  }
  return out;
}

TierSummary summarize_tier(const PoolTier& t) {
  TierSummary r{.name = t.name, .moves = t.moves, .measured_gb_s = t.measured_gb_s, .load = t.load,
                .placement = t.placement};
  for (const LayerStats& l : t.layers) {
    r.slots += l.capacity;
    r.resident += l.resident;
    r.pool += l.pool;
    r.prefetch += l.prefetch;
    r.placed += l.placed;
  }
  r.prefetch_summary = summarize(r.prefetch, r.pool.misses);
  return r;
}

PrefetchReport prefetch_report(const Model& model) {
  PrefetchReport r;
  const ExpertStore* store = model.experts();
  if (!store) return r;
  r.io = store->io_counters();
  if (!store->prefetching()) return r;
  r.on = true;
  r.width = store->prefetch_width();
  r.mean_width = store->mean_prefetch_width();
  r.staging_buffers = store->staging_buffers();
  r.staging_bytes = store->staging_bytes();
  PoolStats pool;
  for (const LayerStats& l : store->stats()) {
    r.counts += l.prefetch;
    pool += l.pool;
  }
  r.summary = summarize(r.counts, pool.misses);
  r.stall_s = pool.stall_s;
  return r;
}

namespace {
ojson placement_json(const PlacementStats& p) {
  return {{"gpu", p.gpu},           {"copied", p.copied},         {"cpu", p.cpu},
          {"cpu_busy_s", p.cpu_busy_s}, {"cpu_wait_s", p.cpu_wait_s}, {"gpu_wait_s", p.gpu_wait_s}};
}

ojson tiers_json(const std::vector<TierSummary>& tiers) {
  ojson out = ojson::array();
  for (const TierSummary& t : tiers) {
    const PoolStats& p = t.pool;
    ojson tier = {{"tier", t.name},
                   {"moves", t.moves},
                   {"slots", t.slots},
                   {"resident", t.resident},
                   {"hits", p.hits},
                   {"misses", p.misses},
                   {"hit_rate", p.hit_rate()},
                   {"bytes", p.bytes_read},
                   {"seconds", p.read_s},
                   {"gb_s", t.gb_s()},
                   {"measured_gb_s", t.measured_gb_s},
                   {"stall_s", p.stall_s},
                   {"overlap", t.overlap()},
                   {"prefetch",
                    {{"predicted", t.prefetch.predicted},
                     {"moved_ahead", t.prefetch.issued},
                     {"used", t.prefetch.used},
                     {"wasted", t.prefetch.wasted},
                     {"for_cpu", t.prefetch.for_cpu},
                     {"recall", t.prefetch_summary.recall},
                     {"waste", t.prefetch_summary.waste}}},
                   {"load",
                    {{"whole", t.load.whole},
                     {"warmed", t.load.warmed},
                     {"pinned", t.load.pinned},
                     {"bytes", t.load.bytes},
                     {"seconds", t.load.seconds},
                     {"gb_s", t.load.gb_s()}}}};
    if (!t.placement.empty()) {  // the VRAM tier: where its misses ran
      tier["placement"] = placement_json(t.placed);
      tier["placement"]["mode"] = t.placement;
    }
    out.push_back(std::move(tier));
  }
  return out;
}

ojson speculative_json(const SpeculativeOptions& o, const SpeculativeStats& s) {
  return {{"default", describe(o)},
          {"verifies", s.verifies},
          {"drafted", s.drafted},
          {"accepted", s.accepted},
          {"acceptance", s.acceptance()},
          {"mean_accepted", s.mean_accepted()},
          {"plain_steps", s.plain_steps},
          {"tokens_per_forward", s.tokens_per_forward()},
          {"last_draft", s.draft}};
}

ojson warm_json(const WarmReport& w, const ExpertStore::Early& e) {
  return {{"mode", warm_start_name(w.mode)},
          {"usage", w.usage_path.empty() ? ojson(nullptr) : ojson(w.usage_path)},
          {"pool_profile", w.profile.empty() ? ojson(nullptr) : ojson(w.profile)},
          {"loaded_whole", w.loaded_whole},
          {"warmed", w.warmed},
          {"pinned", w.pinned},
          {"seconds", w.seconds},
          {"note", w.note},
          {"first_tokens", {{"tokens", e.tokens}, {"hits", e.pool.hits}, {"misses", e.pool.misses}, {"hit_rate", e.pool.hit_rate()}}}};
}

ojson prefetch_json(const PrefetchReport& p) {
  if (!p.on) return {{"on", false}};
  return {{"on", true},
          {"width", p.width},
          {"mean_width", p.mean_width},
          {"staging_buffers", p.staging_buffers},
          {"staging_bytes", p.staging_bytes},
          {"predicted", p.counts.predicted},
          {"read_ahead", p.counts.issued},
          {"used", p.counts.used},
          {"wasted", p.counts.wasted},
          {"no_buffer", p.counts.no_buffer},
          {"bytes_read", p.counts.bytes},
          {"recall", p.summary.recall},
          {"waste", p.summary.waste},
          {"demand_misses_left", p.summary.demand_misses},
          {"stall_s", p.stall_s},
          {"disk_busy_s", p.io.busy_s},
          {"demand_reads_behind_prefetch", p.io.demand_behind_prefetch}};
}
}  // namespace

ojson to_json(const StatsSnapshot& s) {
  ojson layers = ojson::array();
  for (const LayerUsage& l : s.layers) {
    ojson j = {{"layer", l.layer}, {"moe", l.moe}, {"routed_total", l.routed_total}};
    j["routed"] = l.routed;
    layers.push_back(std::move(j));
  }
  ojson pool = ojson::array();
  const bool hybrid = !s.tiers.empty() && !s.tiers.front().placement.empty();  // the VRAM tier's layers
  PoolStats total;
  uint64_t all_miss_bytes = 0;
  for (const LayerStats& l : s.pool) {
    const PoolStats& p = l.pool;
    pool.push_back({{"layer", l.name}, {"slots", l.capacity}, {"resident", l.resident}, {"hits", p.hits},
                    {"misses", p.misses}, {"evictions", p.evictions}, {"hit_rate", p.hit_rate()},
                    {"bytes_read", p.bytes_read}, {"read_s", p.read_s}, {"stall_s", p.stall_s}});
    if (hybrid) pool.back()["placement"] = placement_json(l.placed);
    total += p;
    all_miss_bytes += (p.hits + p.misses) * l.slot_bytes;
  }
  ojson recent = ojson::array();
  for (const RequestRecord& r : s.recent)
    recent.push_back({{"prompt_tokens", r.prompt_tokens},
                      {"reused_tokens", r.reused_tokens},
                      {"completion_tokens", r.completion_tokens},
                      {"time_to_first_token_s", r.time_to_first_token_s},
                      {"prefill_tok_s", r.prefill_tok_s},
                      {"decode_tok_s", r.decode_tok_s},
                      {"finish_reason", r.finish_reason}});
  return {{"uptime_s", s.uptime_s},
          {"requests",
           {{"served", s.requests_served},
            {"cancelled", s.requests_cancelled},
            {"timed_out", s.requests_timed_out},
            {"rejected", s.requests_rejected}}},
          {"tokens", {{"prompt", s.prompt_tokens}, {"reused", s.reused_tokens}, {"completion", s.completion_tokens}}},
          {"resident_bytes",
           {{"dense", s.resident.dense},
            {"experts", s.resident.experts},
            {"state", s.resident.state},
            {"total", s.resident.dense + s.resident.experts + s.resident.state}}},
          {"recent_requests", std::move(recent)},
          {"layers", std::move(layers)},
          {"expert_pool",
           {{"layers", std::move(pool)},
            {"hits", total.hits},
            {"misses", total.misses},
            {"hit_rate", total.hit_rate()},
            {"bytes_read", total.bytes_read},
            {"read_s", total.read_s},
            {"stall_s", total.stall_s},
            {"disk_load_ratio", all_miss_bytes ? double(total.bytes_read) / double(all_miss_bytes) : 0.0}}},
          {"tiers", tiers_json(s.tiers)},
          {"prefetch", prefetch_json(s.prefetch)},
          {"speculative", speculative_json(s.speculative_default, s.speculative)},
          {"kv_cache",
           {{"format", s.kv.format},
            {"bytes_per_position", s.kv.bytes_per_position},
            {"float32_bytes_per_position", s.kv.float32_bytes_per_position},
            {"bytes", s.kv.bytes},
            {"positions", s.kv.positions}}},
          {"warm_start", warm_json(s.warm, s.early)}};
}

}  // namespace ms
