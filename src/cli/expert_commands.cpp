// simulate: replay routing traces through the real pool and policy code, no compute.
// profile: measure each layer's working set on real prompts and write a pool profile.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/model_options.h"
#include "experts/simulate.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "util/error.h"

namespace ms::cli {

namespace {

void add_simulate(CLI::App& app) {
  auto* cmd = app.add_subcommand("simulate", "Replay routing traces through the expert pool; hit rates vs LRU and Belady");
  struct Args {
    std::string routes, policy = "lru";
    int slots = 0, experts = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--routes", a->routes, "Traces: safetensors with docN.routes int16 [layers, T, top_k]")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--slots", a->slots, "Pool slots per layer")->required()->check(int_in(1, 1 << 20));
  cmd->add_option("--policy", a->policy, "Eviction policy")->check(CLI::IsMember({"lru", "lfu", "lrfu"}));
  cmd->add_option("--experts", a->experts, "Experts per layer (default: largest id in the traces + 1)")
      ->check(int_in(1, 1 << 20));
  cmd->callback([a] {
    RouteTraces t = load_route_traces(a->routes, a->experts);
    const PolicyKind kind = parse_policy(a->policy);
    SimResult pol = simulate_policy(t, a->slots, kind);
    SimResult lru = simulate_policy(t, a->slots, PolicyKind::LRU);
    SimResult opt = simulate_belady(t, a->slots);
    fmt::print("{} documents, {} layers, {} experts, top-{}, {} slots per layer\n", t.routes.size(), t.n_layers,
               t.n_experts, t.top_k, a->slots);
    fmt::print("{:>6} {:>8} {:>8} {:>8} {:>10}\n", "layer", a->policy, "lru", "belady", "of belady");
    auto ratio = [](double x, double b) { return b > 0 ? x / b : 0.0; };
    for (int l = 0; l < t.n_layers; ++l)
      fmt::print("{:>6} {:>8.3f} {:>8.3f} {:>8.3f} {:>10.3f}\n", l, pol.hit_rate(l), lru.hit_rate(l), opt.hit_rate(l),
                 ratio(pol.hit_rate(l), opt.hit_rate(l)));
    fmt::print("{:>6} {:>8.3f} {:>8.3f} {:>8.3f} {:>10.3f}\n", "total", pol.total_hit_rate(), lru.total_hit_rate(),
               opt.total_hit_rate(), ratio(pol.total_hit_rate(), opt.total_hit_rate()));
  });
}

// Runs the prompts with every expert allowed to stay resident: what each layer's pool holds at
// the end is the high-water of its distinct experts.
void add_profile(CLI::App& app) {
  auto* cmd = app.add_subcommand("profile", "Run prompts and write the per-layer pool profile --pool-profile reads");
  struct Args {
    ModelArgs m;
    std::string prompts, out;  // default: the model directory's pool_profile.json
    double margin = 1.1;
    int max_tokens = 64;
  };
  auto a = std::make_shared<Args>();
  add_model_options(cmd, a->m, true);
  cmd->add_option("--prompts", a->prompts, "Text file, one prompt per line")->required()->check(CLI::ExistingFile);
  cmd->add_option("--out", a->out, "Where to write the profile (default: pool_profile.json in the model directory, "
                                   "which later runs use unless --pool-profile says otherwise)")
      ->check(non_empty());
  cmd->add_option("--margin", a->margin, "Caps = high-water x margin")->check(real_in(1.0, 10.0));
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens generated per prompt")->check(int_in(0, 1 << 30));
  cmd->callback([a] {
    ModelOptions opt = model_options(a->m);
    opt.experts.slots = 0;  // every expert may stay: nothing is evicted, resident = high-water
    opt.experts.layer_caps.clear();
    opt.memory_budget = 0;
    opt.load_whole = false;  // and nothing read before the prompts route it
    opt.warm_start = WarmStart::Off;
    opt.experts.pins.clear();
    if (a->out.empty()) a->out = (std::filesystem::path(a->m.model) / "pool_profile.json").string();
    auto engine = Engine::load(a->m.model, opt);
    if (!engine->model().experts()) fail("{}: profile needs an engine directory (moestream convert) whose experts stream", a->m.model);
    std::ifstream in(a->prompts);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      Session session(*engine);
      GenerationRequest req;
      req.prompt = engine->tokenizer().encode(line);
      req.max_tokens = a->max_tokens;
      session.generate(req);
      ++n;
    }
    if (n == 0) fail("{}: no prompts (one per line)", a->prompts);
    nlohmann::json caps = nlohmann::json::object();
    const int top_k = engine->model().config().top_k;
    for (const LayerStats& l : engine->model().pool_stats()) {
      const int layer = model_layer_of(l.name);
      if (layer < 0) continue;  // the MTP head's pool follows --expert-slots
      const int cap = std::min(l.capacity, std::max(top_k, int(std::ceil(l.resident * a->margin))));
      caps[std::to_string(layer)] = cap;
      fmt::print("{:>22}: high-water {:>4} of {} -> cap {}\n", l.name, l.resident, l.capacity, cap);
    }
    std::ofstream out(a->out);
    out << nlohmann::json{{"layer_caps", caps}}.dump(2) << "\n";
    if (!out) fail("{}: cannot write the profile", a->out);
    fmt::print("{} prompts; profile written to {}\n", n, a->out);
  });
}

}  // namespace

void register_expert_commands(CLI::App& app) {
  add_simulate(app);
  add_profile(app);
}

}  // namespace ms::cli
