// convert: a Hugging Face or MLX checkpoint, or a GGUF file -> an engine model directory (docs/FORMAT.md).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "writers/convert.h"

namespace ms::cli {

void add_engine_output_options(CLI::App* cmd, std::string& out, int& expert_bits, int& expert_group) {
  cmd->add_option("--out", out, "Output directory (must not exist unless --force)")->required()->check(non_empty());
  cmd->add_option("--expert-bits", expert_bits, "Bits of routed expert weights; 16 = bf16, unquantized")
      ->check(CLI::IsMember({2, 3, 4, 8, 16}))
      ->capture_default_str();
  cmd->add_option("--expert-group", expert_group, "Quantization group size of expert weights")
      ->check(CLI::IsMember({32, 64, 128}))
      ->capture_default_str();
}

namespace {

void add_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face or MLX checkpoint, or a GGUF file, into an engine model directory");
  struct Args {
    ConvertOptions opt;
    std::string proj_bits, layer_bits;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--from", a->opt.from,
                  "Checkpoint: a Hugging Face directory (config.json, safetensors); an mlx-lm quantized directory "
                  "(affine 2, 3, 4, 5, 6 or 8 bits, bf16 or f16 scales: copied exactly); or a llama.cpp GGUF file of "
                  "qwen3next or qwen3moe (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K carried "
                  "without changing a weight; any other type is refused, naming the tensor). Imports keep their file's "
                  "quantization: the --expert-*, --proj-bits, --layer-bits and --dense-* flags are refused for them "
                  "(except for the MTP layer --mtp-from adds)")
      ->required()
      ->check(non_empty());
  cmd->add_option("--mtp-from", a->opt.mtp_from,
                  "With an MLX --from (mlx-lm drops the MTP head): the original Hugging Face checkpoint to take mtp.* from")
      ->check(non_empty());
  add_engine_output_options(cmd, a->opt.out, a->opt.expert_bits, a->opt.expert_group);
  cmd->add_option("--proj-bits", a->proj_bits, "Per-projection expert bits, e.g. gate=2,up=2,down=3")
      ->check(bits_list('=', {"gate", "up", "down"}));
  cmd->add_option("--layer-bits", a->layer_bits, "Per-layer expert bits (all projections), e.g. 0:8,5:3,mtp:8")
      ->check(bits_list(':'));
  cmd->add_option("--dense-bits", a->opt.dense_bits, "Bits of dense matrices: 16 = as stored, 8 or 4 = quantized")
      ->check(CLI::IsMember({4, 8, 16}))
      ->capture_default_str();
  cmd->add_option("--dense-group", a->opt.dense_group, "Quantization group size of dense matrices")
      ->check(CLI::IsMember({32, 64, 128}))
      ->capture_default_str();
  cmd->add_flag("--force", a->opt.force, "Replace an existing output directory");
  cmd->callback([a] {
    if (!a->proj_bits.empty()) a->opt.proj_bits = parse_bits_list("--proj-bits", a->proj_bits, '=');
    if (!a->layer_bits.empty()) a->opt.layer_bits = parse_bits_list("--layer-bits", a->layer_bits, ':');
    a->opt.progress = isatty(STDERR_FILENO) != 0;
    const ConvertStats s = convert_checkpoint(a->opt);
    std::printf("%s: %.1f MB from %.1f MB of tensors in %.1f s\n", a->opt.out.c_str(), double(s.bytes_out) / 1e6,
                double(s.bytes_in) / 1e6, s.seconds);
  });
}

}  // namespace

void register_convert_commands(CLI::App& app) { add_convert(app); }

}  // namespace ms::cli
