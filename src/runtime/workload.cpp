#include "runtime/workload.h"

#include <algorithm>

#include "experts/simulate.h"
#include "runtime/sampler.h"
#include "util/error.h"

namespace ms {

const char* Workload::name() const {
  switch (kind) {
    case WorkloadKind::Uniform: return "uniform";
    case WorkloadKind::Text: return "text";
    case WorkloadKind::Replay: return "replay";
    case WorkloadKind::Greedy: break;
  }
  return "greedy";
}

std::vector<WorkloadKind> parse_workloads(const std::string& list) {
  std::vector<WorkloadKind> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    if (item == "uniform") out.push_back(WorkloadKind::Uniform);
    else if (item == "text") out.push_back(WorkloadKind::Text);
    else if (item == "greedy") out.push_back(WorkloadKind::Greedy);
    else if (item == "replay") out.push_back(WorkloadKind::Replay);
    else fail("--workload: '{}' is not uniform, text, greedy or replay", item.substr(0, 64));
    pos = comma + 1;
  }
  return out;
}

std::vector<std::vector<std::vector<int>>> replay_steps(const RouteTraces& t, const ModelConfig& cfg,
                                                        const std::string& path) {
  const std::vector<bool>& moe_layers = cfg.layer_moe;
  const int moe = int(std::count(moe_layers.begin(), moe_layers.end(), true));
  if (t.n_layers != moe)
    fail("{}: a trace of {} layers for a model of {} MoE layers", path, t.n_layers, moe);
  if (t.top_k != cfg.top_k) fail("{}: a trace of top-{} for a model of top-{}", path, t.top_k, cfg.top_k);
  if (t.n_experts > cfg.n_experts)
    fail("{}: the trace routes to expert {}; the model has {}", path, t.n_experts - 1, cfg.n_experts);
  std::vector<std::vector<std::vector<int>>> steps;
  for (const auto& doc : t.routes)
    for (size_t i = 0; !doc.empty() && i < doc[0].size(); ++i) {
      std::vector<std::vector<int>>& step = steps.emplace_back(moe_layers.size());
      for (size_t l = 0, m = 0; l < moe_layers.size(); ++l)
        if (moe_layers[l]) step[l] = doc[m++][i];
    }
  if (steps.size() < 2) fail("{}: the replay workload needs a trace of two tokens or more", path);
  return steps;
}

void run_workload(const Model& m, State& state, const Workload& w, int n, unsigned seed,
                  const std::function<void(int)>& on_step, std::vector<std::vector<std::vector<int>>>* routes) {
  if (w.kind == WorkloadKind::Text && w.text.empty()) fail("the text workload has no tokens");
  if (w.kind == WorkloadKind::Replay && w.routes.empty()) fail("the replay workload has no routes");
  const int vocab = m.config().vocab;
  SamplingParams p;
  p.temperature = w.kind == WorkloadKind::Uniform ? 1.f : 0.f;
  p.seed = seed;
  Sampler sampler(p);
  std::vector<int> seen;  // no penalties: the sampler reads none of it
  const size_t offset = size_t(seed) * 997;  // each repeat a different stretch of the text
  int token = w.kind == WorkloadKind::Text ? w.text[offset % w.text.size()] % vocab : int(seed % unsigned(vocab));
  for (int i = 0; i < n; ++i) {
    ForwardOptions fo;
    fo.routes = routes != nullptr;
    fo.pick = [&] { return sampler.next(seen, vocab); };
    if (w.kind == WorkloadKind::Replay) fo.routes_from = &w.routes[(offset + size_t(i)) % w.routes.size()];
    const ForwardResult r = m.forward(&token, 1, state, fo);
    if (routes) {
      std::vector<std::vector<int>> step;
      for (const auto& layer : r.routes)
        if (!layer.empty()) step.push_back(layer);
      routes->push_back(std::move(step));
    }
    token = w.kind == WorkloadKind::Text ? w.text[(offset + size_t(i) + 1) % w.text.size()] % vocab : r.token;
    if (on_step) on_step(i);
  }
}

RoutingCurve routing_curve(const std::vector<std::vector<std::vector<int>>>& routes, int n_experts, int top_k) {
  if (routes.empty() || routes[0].empty()) return {};
  RouteTraces t;
  t.n_layers = int(routes[0].size());
  t.top_k = top_k;
  t.n_experts = n_experts;
  t.routes.resize(1);
  t.routes[0].assign(size_t(t.n_layers), {});
  for (const auto& step : routes)
    for (size_t l = 0; l < step.size() && l < size_t(t.n_layers); ++l) t.routes[0][l].push_back(step[l]);
  return routing_curve(t);
}

}  // namespace ms
