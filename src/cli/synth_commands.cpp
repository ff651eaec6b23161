// synth: a random-weight model at a real model's shape, written as an engine model directory.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/flag_checks.h"
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

}  // namespace

void register_synth_commands(CLI::App& app) { add_synth(app); }

}  // namespace ms::cli
