#include "server/dashboard.h"

#include <algorithm>

namespace ms {

using ojson = nlohmann::ordered_json;

std::vector<std::string> expert_places(const std::vector<PoolTier>& tiers) {
  std::vector<std::string> where;
  // Top tier first: an expert in VRAM and in the host tier is shown in VRAM.
  for (auto t = tiers.rbegin(); t != tiers.rend(); ++t) {
    const char letter = t->name[0];
    if (where.size() < t->layers.size()) where.resize(t->layers.size());
    for (size_t l = 0; l < t->layers.size(); ++l) {
      const std::vector<uint8_t>& present = t->layers[l].present;
      std::string& w = where[l];
      if (w.size() < present.size()) w.resize(present.size(), 'd');
      for (size_t e = 0; e < present.size(); ++e)
        if (present[e]) w[e] = letter;
    }
  }
  return where;
}

namespace {

ojson plan_json(const char* name, const MemoryPlan& p) {
  return {{"name", name},       {"budget", p.budget},   {"source", p.source},           {"process", p.process},
          {"dense", p.dense},   {"kv", p.kv},           {"activations", p.activations}, {"staging", p.staging},
          {"pool", p.pool},     {"slots", p.slots}};
}

ojson tier_json(const TierSummary& t) {
  return {{"name", t.name},          {"moves", t.moves},           {"slots", t.slots},
          {"resident", t.resident},  {"hits", t.pool.hits},        {"misses", t.pool.misses},
          {"bytes", t.pool.bytes_read}, {"read_s", t.pool.read_s}, {"stall_s", t.pool.stall_s},
          {"measured_gb_s", t.measured_gb_s}, {"recall", t.prefetch_summary.recall}, {"waste", t.prefetch_summary.waste}};
}

// The MoE layers: routing counts, where each expert is and the top tier's figures, by model layer.
ojson layers_json(const StatsSnapshot& s, int n_experts) {
  std::vector<int> store_of(s.layers.size(), -1);  // model layer -> expert-store layer
  for (size_t i = 0; i < s.pool.size(); ++i) {
    const int l = model_layer_of(s.pool[i].name);
    if (l >= 0 && size_t(l) < store_of.size()) store_of[size_t(l)] = int(i);
  }
  const std::vector<std::string> where = expert_places(s.pool_tiers);
  ojson out = ojson::array();
  for (const LayerUsage& u : s.layers) {
    if (!u.moe) continue;
    const int i = store_of[size_t(u.layer)];
    // A layer no store streams holds its experts as weights, in memory: "m".
    ojson j = {{"layer", u.layer},
               {"where", i >= 0 && size_t(i) < where.size() ? where[size_t(i)] : std::string(size_t(n_experts), 'm')},
               {"routed", u.routed}};
    if (i >= 0) {
      const LayerStats& l = s.pool[size_t(i)];
      const PrefetchSummary p = summarize(l.prefetch, l.pool.misses);
      j["hits"] = l.pool.hits, j["misses"] = l.pool.misses, j["slots"] = l.capacity, j["resident"] = l.resident;
      j["predicted"] = l.prefetch.predicted, j["recall"] = p.recall, j["waste"] = p.waste;
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace

ojson dashboard_json(const StatsSnapshot& s, const Model& model, const QueueState& q) {
  const PoolStats top = s.tiers.empty() ? PoolStats{} : s.tiers.front().pool;
  ojson tiers = ojson::array();
  for (const TierSummary& t : s.tiers) tiers.push_back(tier_json(t));
  const bool cuda = model.device() == Device::Cuda;
  ojson plans = ojson::array();
  plans.push_back(plan_json(cuda ? "VRAM" : "RAM", model.memory_plan()));
  if (cuda && model.experts()) plans.push_back(plan_json("host RAM", model.host_memory_plan()));
  const RequestRecord last = s.recent.empty() ? RequestRecord{} : s.recent.back();
  return {{"uptime_s", s.uptime_s},
          {"device", cuda ? "cuda" : "cpu"},
          {"n_experts", model.config().n_experts},
          {"top_k", model.config().top_k},
          {"hit_rate", top.hit_rate()},  // /api/stats' expert_pool.hit_rate
          {"stall_s", top.stall_s},
          {"tokens", {{"prompt", s.forwarded_prompt}, {"steps", s.forwarded_steps}}},
          {"requests", s.requests_served},
          {"last", {{"decode_tok_s", last.decode_tok_s}, {"prefill_tok_s", last.prefill_tok_s}}},
          {"queue", {{"waiting", q.waiting}, {"running", q.running ? 1 : 0}}},
          {"disk_bytes", s.prefetch.io.bytes},
          {"tiers", std::move(tiers)},
          {"resident", {{"dense", s.resident.dense}, {"experts", s.resident.experts}, {"state", s.resident.state}}},
          {"plans", std::move(plans)},
          {"layers", layers_json(s, model.config().n_experts)}};
}

}  // namespace ms
