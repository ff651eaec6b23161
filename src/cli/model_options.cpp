#include "cli/model_options.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/load.h"
#include "cli/flag_checks.h"
#include "format/engine_dir.h"
#include "runtime/stats.h"
#include "util/error.h"
#include "util/thread_pool.h"
#include "util/json.h"
#include "writers/convert.h"
#include "writers/import_gguf.h"
#include "writers/import_mlx.h"

namespace ms::cli {

namespace {
const char* kDefaultModel = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";

int layer_key(const std::string& path, const char* field, const std::string& k) {
  size_t used = 0;
  int layer = -1;
  try {
    layer = std::stoi(k, &used);
  } catch (const std::exception&) {
  }
  if (layer < 0 || used != k.size()) fail("{}: {} key '{}' is not a layer number", path, field, k);
  return layer;
}

// {"layer_caps": {"0": 40, ...}, "pins": {"0": [3, 17], ...}} (pins optional).
void load_pool_profile(const std::string& path, StoreOptions& o) {
  if (!std::ifstream(path)) fail("{}: cannot open pool profile", path);
  const nlohmann::json j = parse_json_file(path);
  if (!j.is_object() || !j.contains("layer_caps") || !j["layer_caps"].is_object())
    fail("{}: expected {{\"layer_caps\": {{\"0\": 40, ...}}}}", path);
  for (auto& [k, v] : j["layer_caps"].items()) {
    const int layer = layer_key(path, "layer_caps", k);
    if (!v.is_number_integer() || v.get<int>() <= 0) fail("{}: layer_caps[\"{}\"] is {}, expected a positive integer", path, k, json_summary(v));
    o.layer_caps[layer] = v.get<int>();
  }
  if (!j.contains("pins")) return;
  if (!j["pins"].is_object()) fail("{}: pins must be an object of layer -> expert ids", path);
  for (auto& [k, v] : j["pins"].items()) {
    const int layer = layer_key(path, "pins", k);
    if (!v.is_array()) fail("{}: pins[\"{}\"] is {}, expected a list of expert ids", path, k, json_summary(v));
    for (auto& e : v) {
      if (!e.is_number_integer() || e.get<int>() < 0) fail("{}: pins[\"{}\"] holds {}, not an expert id", path, k, json_summary(e));
      o.pins[layer].push_back(e.get<int>());
    }
  }
}
}  // namespace

std::string default_pool_profile(const std::string& model_dir) {
  const std::string p = (std::filesystem::path(model_dir) / "pool_profile.json").string();
  return std::filesystem::exists(p) ? p : "";
}

std::string ModelArgs::default_usage() {
  const char* env = std::getenv("MOESTREAM_USAGE");
  return env && *env ? env : "auto";
}

uint64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("'{}' is not a size (expected e.g. 8G, 512M)", text);
  }
  std::string unit = text.substr(used);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else fail("'{}' has an unknown unit '{}' (expected K, M, G or T)", text, unit);
  if (!(v > 0) || !std::isfinite(v)) fail("'{}' is not a positive size", text);
  const double bytes = v * mult;
  if (bytes < 1) fail("'{}' is less than a byte (a unit, e.g. {}G, makes it more)", text, text);
  if (bytes > double(uint64_t(1) << 62)) fail("'{}' is larger than any memory", text);
  return uint64_t(bytes);
}

namespace {

// An MLX directory or a GGUF file given as --model: converted into --convert-to (once: a
// directory that already holds an engine model is used as it is), or refused with the one
// command that converts it.
void resolve_model_source(ModelArgs& a) {
  if (is_engine_dir(a.model)) return;
  const bool gguf = is_gguf_file(a.model);
  if (!gguf && !is_mlx_checkpoint(a.model)) return;
  const char* what = gguf ? "a GGUF file" : "an MLX checkpoint";
  if (a.convert_to.empty())
    fail("{} is {}: convert it once with `moestream convert --from {} --out DIR` and run DIR, or pass --convert-to "
         "DIR to do both",
         a.model, what, a.model);
  if (!is_engine_dir(a.convert_to)) {
    ConvertOptions opt;
    opt.from = a.model;
    opt.out = a.convert_to;
    opt.progress = isatty(STDERR_FILENO) != 0;
    std::fprintf(stderr, "converting %s (%s) into %s\n", a.model.c_str(), what, a.convert_to.c_str());
    const ConvertStats s = convert_checkpoint(opt);
    std::fprintf(stderr, "%s: %.1f MB in %.1f s\n", a.convert_to.c_str(), double(s.bytes_out) / 1e6, s.seconds);
  }
  a.model = a.convert_to;
}

}  // namespace

void add_model_options(CLI::App* cmd, ModelArgs& a, bool default_model) {
  auto* m = cmd->add_option("--model", a.model,
                            std::string(default_model ? "Model directory (default: the embedded pycoder-moe-q4)"
                                                      : "Model directory") +
                                "; an MLX checkpoint or a GGUF file runs once converted (--convert-to)");
  if (default_model) a.model = kDefaultModel;
  else m->required();
  m->check(non_empty());
  cmd->add_option("--convert-to", a.convert_to,
                  "Convert an MLX or GGUF --model into this engine directory first (kept: later runs use it)")
      ->check(non_empty());
  cmd->parse_complete_callback([&a] { resolve_model_source(a); });
  cmd->add_option("--expert-slots", a.expert_slots, "Resident expert slots per MoE layer (default: all)")->check(int_in(1, 1 << 20));
  cmd->add_option("--pool-profile", a.pool_profile,
                  "Per-layer slot caps and pinned experts: JSON {\"layer_caps\": {\"0\": 40}, \"pins\": {\"0\": [3, 17]}}; "
                  "default: the model directory's pool_profile.json where there is one; none: no profile")
      ->check(CLI::ExistingFile | CLI::IsMember({"none"}));
  cmd->add_option("--usage", a.usage,
                  "Where the experts' usage history is kept across runs: auto (usage.json under $XDG_STATE_HOME/"
                  "moestream/<model id>/, ~/.local/state when unset; inspect shows it), a file, or off; default "
                  "$MOESTREAM_USAGE, else auto")
      ->check(non_empty());
  cmd->add_flag("--no-load-whole", a.no_load_whole,
                "Read experts as routing asks even where the pools hold them all (by default those are all read at "
                "load, where the memory available allows)");
  cmd->add_option("--warm-start", a.warm_start,
                  "Read each layer's hottest experts by the usage history into its pool at load: auto (as residents "
                  "the policy may evict), pin (never evicted) or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "pin", "off"}));
  cmd->add_option("--warm-fraction", a.warm_fraction, "Share of each pool's slots warm start fills")
      ->capture_default_str()
      ->check(real_in(0.0, 1.0));
  cmd->add_option("--memory", a.memory, "Memory budget (e.g. 8G): the expert pools get what dense, KV and activations leave")
      ->check(byte_size());
  cmd->add_option("--context", a.context,
                  "Tokens the memory plan (--memory, --vram) holds KV for; a sequence's KV cache stays within it while "
                  "the sequence fits")
      ->capture_default_str()
      ->check(int_in(1, 1 << 24))
      ->each([&a](const std::string&) { a.context_given = true; });
  cmd->add_option("--kv-bits", a.kv_bits,
                  "Bits of the KV cache's keys and values: K,V of 32 (float32, exact), 16 (bf16), 8, 4, 3 or 2 "
                  "(affine groups with half scales), e.g. 16,16 or 4,3; one number for both")
      ->capture_default_str()
      ->check(parses_with([](const std::string& s) { KvFormat f; parse_kv_bits(s, f); }, "K,V"));
  cmd->add_option("--kv-group", a.kv_group, "Values per scale and bias of a quantized KV cache (32, 64 or 128)")
      ->capture_default_str()
      ->check(CLI::IsMember({32, 64, 128}));
  cmd->add_option("--kv-rotation", a.kv_rotation,
                  "Fixed orthogonal rotation of quantized keys and values before they are quantized: hadamard (the "
                  "whole head), so4 (blocks of 4), or none")
      ->capture_default_str()
      ->check(CLI::IsMember({"so4", "hadamard", "none"}));
  cmd->add_option("--policy", a.policy, "Expert eviction policy")->check(CLI::IsMember({"lru", "lfu", "lrfu"}));
  cmd->add_option("--io", a.io, "Expert reads: io_uring or a pread thread pool")->check(CLI::IsMember({"auto", "uring", "pread"}));
  cmd->add_flag("--no-direct-io", a.no_direct_io, "Read experts through the page cache (no O_DIRECT)");
  cmd->add_flag("--verify,!--no-verify", a.verify,
                "Checksum every expert record read, and the dense weights at load (format 2 and later); on by "
                "default, --no-verify turns it off");
  cmd->add_option("--device", a.device,
                  "Where the forward runs: cpu, cuda (dense weights and the expert pool in VRAM), or auto (cuda when a "
                  "GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--vram", a.vram, "cuda: VRAM budget (e.g. 16G): the expert pools get what dense, KV and activations leave")
      ->check(byte_size());
  cmd->add_option("--host-cache", a.host_cache,
                  "cuda: host RAM caching experts between SSD and VRAM: a size (e.g. 8G), auto (the default: as "
                  "many as fit in the memory the process may use, every expert read at load where they all fit) or "
                  "0 (staging for one token only)")
      ->check(byte_size() | CLI::IsMember({"auto", "0"}));
  cmd->add_option("--host-policy", a.host_policy, "cuda: eviction policy of the host cache")->check(CLI::IsMember({"lru", "lfu", "lrfu"}));
  cmd->add_option("--prefetch", a.prefetch,
                  "Read the experts that a later layer's router, applied to this layer's input, predicts, while this "
                  "layer computes: on, off, or auto (on where the pools cannot hold every expert; off for the VRAM pools)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--prefetch-ahead", a.prefetch_ahead,
                  "Layers ahead a prediction reaches: A, or E,A@C (E layers ahead below layer C, A from it)")
      ->capture_default_str()
      ->check(parses_with([](const std::string& s) { PrefetchOptions o; parse_prefetch_ahead(s, o); }, "A|E,A@C"));
  cmd->add_option("--prefetch-width", a.prefetch_width,
                  "Experts a prediction names: N, or auto (adapted between top_k/2 and 2 top_k to the disk's spare "
                  "bandwidth)")
      ->capture_default_str()
      ->check(parses_with([](const std::string& s) { parse_prefetch_width(s); }, "N|auto"));
  cmd->add_option("--prefetch-staging", a.prefetch_staging,
                  "Buffers prefetch reads land in (default: 2 x the widest width x the layers ahead); in the memory plan")
      ->check(int_in(1, 1 << 16));
  cmd->add_option("--cpu-experts", a.cpu_experts,
                  "cuda: where a decode token's experts missing from VRAM run: auto (each copied to VRAM or computed by "
                  "the CPU from the host tier, by measured cost; the same answer either way), off (every miss copied; "
                  "the default until the hybrid decode is measured on a GPU), or N (the first N MoE layers' experts "
                  "always on the CPU, as llama.cpp's --n-cpu-moe)")
      ->capture_default_str()
      ->check(parses_with([](const std::string& s) { parse_cpu_experts(s); }, "auto|off|N"));
  cmd->add_option("--threads", a.threads, "CPU threads for the CPU's kernels and experts (default: MOESTREAM_THREADS or the cores)")
      ->check(int_in(1, 1024));
  cmd->add_option("--h2d-rate", a.h2d_rate,
                  "cuda, benchmarks: pace host-to-VRAM copies to this rate (e.g. 25G for a PCIe 4 card), bytes a second")
      ->check(byte_size());
  cmd->add_flag("--no-cuda-graphs", a.no_cuda_graphs,
                "cuda: launch each kernel of a decode step from the host instead of replaying the step as a CUDA graph");
}

void add_speculative_options(CLI::App* cmd, ModelArgs& a) {
  cmd->add_option("--speculative", a.speculative,
                  "mtp: draft tokens with the model's MTP head and verify them in one forward (the same output); auto: mtp "
                  "where the model has an MTP head that runs on its device; off")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "mtp", "auto"}));
  cmd->add_option("--draft", a.draft,
                  fmt::format("Drafts per verify with --speculative mtp: 1 to {}, or auto (chosen per step from the "
                              "measured acceptance and costs)",
                              kMaxDraft))
      ->capture_default_str()
      ->check(parses_with([](const std::string& s) { parse_draft(s); }, "K|auto"));
}

void print_speculative_stats(const SpeculativeOptions& opt, const SpeculativeStats& s, std::FILE* out) {
  if (!opt.mtp) return;
  fmt::print(out,
             "speculative {}: {} verifies, {} drafted, {} accepted ({:.3f}), {:.2f} accepted per verify, {} plain "
             "steps, {:.2f} tokens per forward, last K {}\n",
             describe(opt), s.verifies, s.drafted, s.accepted, s.acceptance(), s.mean_accepted(), s.plain_steps,
             s.tokens_per_forward(), s.draft);
  std::string times = fmt::format("  measured: plain step {:.2f} ms, draft step {:.2f} ms", s.plain_s * 1e3, s.draft_s * 1e3);
  for (int k = 1; k <= kMaxDraft; ++k)
    if (s.verify_s[size_t(k)] > 0) times += fmt::format(", verify of {} {:.2f} ms", k, s.verify_s[size_t(k)] * 1e3);
  fmt::print(out, "{}\n", times);
}

ModelOptions model_options(const ModelArgs& a) {
  ModelOptions o;
  o.experts.slots = a.expert_slots;
  o.pool_profile = a.pool_profile.empty() ? default_pool_profile(a.model) : a.pool_profile;
  if (o.pool_profile == "none") o.pool_profile.clear();
  if (!o.pool_profile.empty()) load_pool_profile(o.pool_profile, o.experts);
  o.usage = a.usage == "auto" ? "" : a.usage;
  o.warm_start = a.warm_start == "pin" ? WarmStart::Pin : a.warm_start == "off" ? WarmStart::Off : WarmStart::Auto;
  o.warm_fraction = a.warm_fraction;
  o.load_whole = !a.no_load_whole;
  o.progress = isatty(STDERR_FILENO) != 0;
  o.experts.policy = parse_policy(a.policy);
  o.experts.io = parse_io_kind(a.io);
  o.experts.direct_io = !a.no_direct_io;
  o.experts.verify = a.verify;
  if (!a.memory.empty()) o.memory_budget = parse_bytes(a.memory);
  o.context = a.context;
  o.context_given = a.context_given;
  parse_kv_bits(a.kv_bits, o.kv);
  o.kv.k.group = o.kv.v.group = a.kv_group;
  o.kv.rotation = parse_kv_rotation(a.kv_rotation);
  o.device = a.device == "cuda" ? Device::Cuda : a.device == "cpu" ? Device::Cpu : default_device();
  if (o.device == Device::Cpu && (!a.vram.empty() || !a.host_cache.empty()))
    fail("--vram and --host-cache size the GPU's expert tiers: they need --device cuda (and a GPU)");
  // --host-cache: auto (the default) sizes the host tier from the memory the process may use; 0
  // keeps staging only.
  o.host_cache_auto = o.device == Device::Cuda && (a.host_cache.empty() || a.host_cache == "auto");
  o.cuda_graphs = !a.no_cuda_graphs;
  o.cpu_experts = parse_cpu_experts(a.cpu_experts);
  if (o.device == Device::Cpu && (a.cpu_experts != "off" || !a.h2d_rate.empty()))
    fail("--cpu-experts and --h2d-rate place experts between the CPU and the GPU: they need --device cuda");
  if (!a.h2d_rate.empty()) o.experts.h2d_rate = double(parse_bytes(a.h2d_rate));
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  if (!a.vram.empty()) o.vram_budget = parse_bytes(a.vram);
  if (!a.host_cache.empty() && a.host_cache != "auto" && a.host_cache != "0") o.host_cache = parse_bytes(a.host_cache);
  o.host_policy = parse_policy(a.host_policy);
  PrefetchOptions& p = o.experts.prefetch;
  p.mode = parse_prefetch_mode(a.prefetch);
  parse_prefetch_ahead(a.prefetch_ahead, p);
  p.width = parse_prefetch_width(a.prefetch_width);
  p.staging = a.prefetch_staging;
  o.speculative = {.mtp = a.speculative == "mtp", .automatic = a.speculative == "auto", .draft = parse_draft(a.draft)};
  return o;
}

void print_kv_stats(const Model& model, size_t held_bytes, int positions, std::FILE* out) {
  const KvFormat f32;
  fmt::print(out, "KV cache: {}, {:.1f} KiB a position (float32: {:.1f} KiB), {:.1f} MiB held for {} positions\n",
             model.kv_format().describe(), double(model.kv_bytes_per_position()) / 1024,
             double(model.kv_bytes_per_position(&f32)) / 1024, double(held_bytes) / (1 << 20), positions);
}

namespace {

// One row per layer and a total; the byte and time columns are what `bytes_what` says.
PoolStats print_pool(const std::vector<LayerStats>& layers, const char* bytes_what, std::FILE* out) {
  fmt::print(out, "{:>22} {:>6} {:>9} {:>9} {:>9} {:>7} {:>10} {:>8} {:>8}\n", "layer", "slots", "hits", "misses",
             "evictions", "hit", fmt::format("{} MiB", bytes_what), fmt::format("{} s", bytes_what), "stall s");
  PoolStats total;
  auto row = [&](const std::string& name, const std::string& slots, const PoolStats& s) {
    fmt::print(out, "{:>22} {:>6} {:>9} {:>9} {:>9} {:>7.3f} {:>10.1f} {:>8.3f} {:>8.3f}\n", name, slots, s.hits, s.misses,
               s.evictions, s.hit_rate(), double(s.bytes_read) / (1 << 20), s.read_s, s.stall_s);
  };
  for (const LayerStats& l : layers) {
    row(l.name, std::to_string(l.capacity), l.pool);
    total += l.pool;
  }
  row("total", "", total);
  return total;
}

double gb_per_s(uint64_t bytes, double s) { return s > 0 ? double(bytes) / s / 1e9 : 0.0; }

// One line: the prefetcher's width and staging, its counters, recall and waste.
void print_prefetch_stats(const Model& model, std::FILE* out) {
  const PrefetchReport r = prefetch_report(model);  // what /api/stats reports too
  if (!r.on) return;
  const PrefetchStats& p = r.counts;
  fmt::print(out,
             "prefetch: width {} (mean {:.1f}), staging {} buffers ({:.1f} MiB); predicted {}, read ahead {}, used {}, "
             "wasted {}, no buffer {}; recall {:.3f}, waste {:.3f}, demand misses left {}\n",
             r.width, r.mean_width, r.staging_buffers, double(r.staging_bytes) / (1 << 20), p.predicted, p.issued, p.used,
             p.wasted, p.no_buffer, r.summary.recall, r.summary.waste, r.summary.demand_misses);
}

// " (measured at start 55.1 GB/s)" where a rate was measured.
std::string measured(double gb_s) { return gb_s > 0 ? fmt::format(" (measured at start {:.2f} GB/s)", gb_s) : std::string(); }

// A VRAM pool over a host tier: what the VRAM's load held, both stages of a miss against the
// rates measured at start, the copies' overlap with compute, and the VRAM prefetch.
void print_vram_tiers(const TierSummary& v, const TierSummary& h, std::FILE* out) {
  const TierLoad& l = v.load;
  if (l.whole) fmt::print(out, "VRAM at load: every expert ({:.1f} MiB in {:.2f} s)\n", double(l.bytes) / (1 << 20), l.seconds);
  else if (l.warmed > 0)
    fmt::print(out, "VRAM at load: warm start copied {} hot experts ({} pinned) in {:.2f} s\n", l.warmed, l.pinned, l.seconds);
  fmt::print(out,
             "stages: ssd->host {:.2f} GB/s ({:.1f} MiB in {:.3f} s){}, host->vram {:.2f} GB/s ({:.1f} MiB in {:.3f} s){}; "
             "stall {:.3f} s ({:.0f} % of the copies' time hidden behind compute)\n",
             h.gb_s(), double(h.pool.bytes_read) / (1 << 20), h.pool.read_s, measured(h.measured_gb_s), v.gb_s(),
             double(v.pool.bytes_read) / (1 << 20), v.pool.read_s, measured(v.measured_gb_s), v.pool.stall_s,
             100.0 * v.overlap());
  if (v.prefetch.predicted == 0) return;
  const PrefetchStats& p = v.prefetch;
  fmt::print(out,
             "VRAM prefetch: predicted {}, copied ahead {}, used {}, wasted {}, left for the CPU {}; recall {:.3f}, waste "
             "{:.3f}, demand misses left {}\n",
             p.predicted, p.issued, p.used, p.wasted, p.for_cpu, v.prefetch_summary.recall, v.prefetch_summary.waste,
             v.prefetch_summary.demand_misses);
}

// Where the VRAM tier's decode experts ran (the hybrid decode), in total and layer by layer.
void print_placement(const PoolTier& vram, std::FILE* out) {
  if (vram.placement.empty()) return;
  fmt::print(out, "placement: {}\n", vram.placement);
  PlacementStats total;
  for (const LayerStats& l : vram.layers) total += l.placed;
  if (total.gpu + total.copied + total.cpu == 0) return;
  fmt::print(out, "{:>22} {:>9} {:>9} {:>9} {:>11} {:>11} {:>11}\n", "layer", "in vram", "copied", "on cpu", "cpu busy s",
             "cpu wait s", "gpu wait s");
  auto row = [&](const std::string& name, const PlacementStats& p) {
    fmt::print(out, "{:>22} {:>9} {:>9} {:>9} {:>11.3f} {:>11.3f} {:>11.3f}\n", name, p.gpu, p.copied, p.cpu,
               p.cpu_busy_s, p.cpu_wait_s, p.gpu_wait_s);
  };
  for (const LayerStats& l : vram.layers) row(l.name, l.placed);
  row("total", total);
}

}  // namespace

void print_expert_stats(const Model& model, std::FILE* out) {
  const std::vector<PoolTier> tiers = model.executor().pool_tiers();
  if (tiers.empty()) return;
  if (const std::string plan = describe(model.memory_plan(), model.device()); !plan.empty()) fmt::print(out, "{}\n", plan);
  if (model.device() == Device::Cuda) fmt::print(out, "{}\n", describe_host_tier(model.host_memory_plan()));
  fmt::print(out, "{}\n", describe(model.warm_report()));
  if (const ExpertStore::Early e = model.experts()->early(); e.tokens > 0)
    fmt::print(out, "first {} tokens: hit rate {:.3f} ({} hits, {} misses; the run's first forwards, prompt included)\n",
               e.tokens, e.pool.hit_rate(), e.pool.hits, e.pool.misses);
  std::vector<PoolStats> totals;
  for (const PoolTier& t : tiers) {
    fmt::print(out, "{}:\n", t.title);
    totals.push_back(print_pool(t.layers, t.moves, out));
  }
  if (tiers.size() == 2) {  // a VRAM pool over a host tier: both stages of a miss
    print_vram_tiers(summarize_tier(tiers[0]), summarize_tier(tiers[1]), out);
    print_placement(tiers[0], out);
    print_prefetch_stats(model, out);
    return;
  }
  uint64_t all_miss_bytes = 0, prefetch_bytes = 0;
  for (const LayerStats& l : tiers[0].layers) {
    all_miss_bytes += (l.pool.hits + l.pool.misses) * l.slot_bytes;
    prefetch_bytes += l.prefetch.bytes;
  }
  // Every byte the disk read, demand and prefetch, over what the routed experts weigh.
  const double ratio = all_miss_bytes ? double(totals[0].bytes_read + prefetch_bytes) / double(all_miss_bytes) : 0.0;
  const IoCounters io = model.experts()->io_counters();
  fmt::print(out, "disk_load_ratio {:.3f}  read {:.2f} GB/s (disk busy {:.3f} s)\n", ratio, gb_per_s(io.bytes, io.busy_s), io.busy_s);
  print_prefetch_stats(model, out);
}


}  // namespace ms::cli
