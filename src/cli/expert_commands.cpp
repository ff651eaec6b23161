// simulate: replay routing traces through the real pool and policy code, no compute.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "cli/commands.h"
#include "experts/simulate.h"

namespace ms::cli {

namespace {

void add_simulate(CLI::App& app) {
  auto* cmd = app.add_subcommand("simulate", "Replay routing traces through the expert pool; hit rates vs LRU and Belady");
  struct Args {
    std::string routes, policy = "lru";
    int slots = 0, experts = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--routes", a->routes, "Traces: safetensors with docN.routes int16 [layers, T, top_k]")->required();
  cmd->add_option("--slots", a->slots, "Pool slots per layer")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--policy", a->policy, "Eviction policy")->check(CLI::IsMember({"lru", "lfu", "lrfu"}));
  cmd->add_option("--experts", a->experts, "Experts per layer (default: largest id in the traces + 1)");
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

}  // namespace

void register_expert_commands(CLI::App& app) { add_simulate(app); }

}  // namespace ms::cli
