#pragma once
// The options every model-running command shares: which model, and how its experts stream.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "model/model.h"
#include "runtime/speculative.h"

namespace ms::cli {

struct ModelArgs {
  std::string model;
  std::string convert_to;  // --convert-to: where an MLX or GGUF --model is converted first
  int expert_slots = 0;
  std::string pool_profile, memory, policy = "lru", io = "auto";
  int context = 4096;
  bool context_given = false;  // --context was passed
  std::string kv_bits = "32,32", kv_rotation = "hadamard";
  int kv_group = 64;
  bool no_direct_io = false, verify = true;
  std::string device = "auto", vram, host_cache, host_policy = "lru";
  bool no_cuda_graphs = false, no_load_whole = false;
  // off until auto is measured against it on a GPU (docs/gpu.md); auto is the aim.
  std::string cpu_experts = "off", h2d_rate;
  int threads = 0;  // 0: MOESTREAM_THREADS or the cores
  std::string prefetch = "auto", prefetch_ahead = "1", prefetch_width = "auto";
  int prefetch_staging = 0;
  std::string speculative = "off", draft = "auto";  // add_speculative_options'
  std::string usage = default_usage(), warm_start = "pin";
  double warm_fraction = 0.5;
  // --usage's default: $MOESTREAM_USAGE where set, else auto.
  static std::string default_usage();
};

// The pool profile runs of a model directory use unless told otherwise: its pool_profile.json
// where there is one, else "".
std::string default_pool_profile(const std::string& model_dir);

// --model defaults to the embedded pycoder-moe-q4 when `default_model` is set.
void add_model_options(CLI::App* cmd, ModelArgs& a, bool default_model = false);
ModelOptions model_options(const ModelArgs& a);
// --speculative and --draft, for the commands that generate.
void add_speculative_options(CLI::App* cmd, ModelArgs& a);

// "speculative mtp auto: 40 verifies, 120 drafted, 90 accepted (0.750) ..." for --stats.
void print_speculative_stats(const SpeculativeOptions& opt, const SpeculativeStats& s, std::FILE* out);

// "8G", "512M", "1.5GiB", "1000000" -> bytes; throws naming the text.
uint64_t parse_bytes(const std::string& text);

// "KV cache: K4/V3 g64 so4, 1.1 KiB a position (float32: 10.0 KiB), 2.2 MiB held for 2048
// positions" for --stats: the format, and what a state's caches hold.
void print_kv_stats(const Model& model, size_t held_bytes, int positions, std::FILE* out);

// Per-layer and total pool statistics of a streamed model (nothing for a checkpoint); on CUDA the
// VRAM pool, the host tier and the achieved GB/s of each stage (SSD -> host, host -> VRAM).
void print_expert_stats(const Model& model, std::FILE* out);

}  // namespace ms::cli
