// synth: a random-weight model at a real model's shape, written as an engine model directory.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "experts/route_synth.h"
#include "writers/synth.h"

namespace ms::cli {

namespace {

void add_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth", "Write a random-weight model directly as an engine model directory");
  struct Args {
    SynthOptions opt;
    std::string arch = "qwen3_next", like;
    int layers = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--arch", a->arch, "Architecture")->check(CLI::IsMember({"qwen3_next"}))->capture_default_str();
  cmd->add_option("--like", a->like, "Dimensions: 80b-a3b (Qwen3-Next-80B-A3B) or tiny (for tests)")
      ->check(CLI::IsMember({"80b-a3b", "tiny"}))
      ->required();
  cmd->add_option("--layers", a->layers, "Decoder layers (default: the shape's own, 48 for 80b-a3b)")->check(int_in(1, 1 << 20));
  add_engine_output_options(cmd, a->opt.out, a->opt.expert_bits, a->opt.expert_group);
  cmd->add_option("--dense-bits", a->opt.dense_bits, "Bits of dense matrices: 16 = bf16, 8 or 4 = quantized")
      ->check(CLI::IsMember({4, 8, 16}))
      ->capture_default_str();
  cmd->add_option("--seed", a->opt.seed, "Random seed (the weights are a function of it)")
      ->capture_default_str()
      ->check(int_in(0, INT64_MAX));
  cmd->add_flag("--force", a->opt.force, "Replace an existing output directory");
  cmd->add_flag("--mtp", a->opt.mtp, "Give the model an MTP head (random: its drafts are nearly never kept)");
  cmd->callback([a] {
    a->opt.shape = synth_shape(a->like);
    if (a->layers > 0) a->opt.shape.layers = a->layers;
    a->opt.progress = isatty(STDERR_FILENO) != 0;
    const SynthStats s = synth_model(a->opt);
    std::printf("%s: %.1f MB in %.1f s\n", a->opt.out.c_str(), double(s.bytes_out) / 1e6, s.seconds);
  });
}

// synth-routes: a routing trace for a synth's replay workload (bench --workload replay), its
// locality calibrated to real models' (experts/route_synth.h).
void add_synth_routes(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth-routes",
                                 "Write a routing trace with the locality of real MoE models, for bench --workload replay");
  struct Args {
    std::string like, out;
    int layers = 0, tokens = 4096;
    uint64_t seed = 1;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--like", a->like, "The synth's shape it routes: 80b-a3b or tiny")
      ->check(CLI::IsMember({"80b-a3b", "tiny"}))
      ->required();
  cmd->add_option("--layers", a->layers, "MoE layers (default: the shape's own)")->check(int_in(1, 1 << 20));
  cmd->add_option("--tokens", a->tokens, "Tokens (decode steps) in the trace")->capture_default_str()->check(int_in(2, 1 << 24));
  cmd->add_option("--seed", a->seed, "Random seed (the trace is a function of it)")->capture_default_str();
  cmd->add_option("--out", a->out, "The trace file to write (safetensors)")->required();
  cmd->callback([a] {
    const SynthShape shape = synth_shape(a->like);
    RouteSynth p{.layers = a->layers > 0 ? a->layers : shape.layers, .experts = shape.n_experts,
                 .top_k = shape.top_k, .tokens = a->tokens, .seed = a->seed};
    p = calibrate_routes(p);
    const RouteTraces t = synth_routes(p);
    write_route_traces(a->out, t);
    const RoutingCurve c = routing_curve(t);
    std::printf("%s: %d layers x %d tokens of top-%d over %d experts (popularity 1/rank^%.3f, %.3f of a token's experts "
                "kept): LRU hit rate at 1/16, 1/8, 1/4, 1/2 of a layer's experts %.2f / %.2f / %.2f / %.2f, reused at "
                "the next token %.2f (real 512-expert top-10 models: ~0.67 at 1/8, ~0.81 at 1/4, ~0.45)\n",
                a->out.c_str(), p.layers, p.tokens, p.top_k, p.experts, p.skew, p.keep, c.hit[0], c.hit[1], c.hit[2],
                c.hit[3], c.reuse);
  });
}

}  // namespace

void register_synth_commands(CLI::App& app) {
  add_synth(app);
  add_synth_routes(app);
}

}  // namespace ms::cli
