// bench: prompt processing and decode speed of one loaded model, in the manner of llama-bench,
// beside the machine's memory bandwidth measured in the same run: decode reads every dense
// weight and top_k experts a layer per token, so its GB/s against that bound says how far the
// kernels are from the memory.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <random>
#include <string>
#include <vector>

#include "backends/load.h"
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/model_options.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/quant_matmul.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/stats.h"
#include "runtime/workload.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace ms::cli {

namespace {

using Clock = std::chrono::steady_clock;

const char* kDefaultText = MOESTREAM_SOURCE_DIR "/docs/ARCHITECTURE.md";
const char* kEmbeddedTokenizer = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4/tokenizer.json";

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bytes of weights one decode step reads: the dense weights but the embedding (one row) and the
// MTP head, and top_k experts of every MoE layer.
double decode_bytes(const Model& m) {
  const ModelWeights& w = m.weights();
  const ModelConfig& c = m.config();
  double b = double(w.dense_bytes - w.mtp_bytes);
  if (w.lm_head.data != w.embed.data) {
    const Mat& e = w.embed;
    b -= e.type == WeightType::Affine
             ? double(size_t(e.rows) * e.quant().row_bytes() + size_t(e.rows) * size_t(e.cols / e.group) * 4)
             : double(size_t(e.rows) * size_t(e.cols) * (e.type == WeightType::BF16 ? 2 : 4));
  }
  if (const ExpertStore* s = m.experts()) {
    for (const ExpertLayer& l : s->index().layers)
      if (model_layer_of(l.name) >= 0) b += double(c.top_k) * double(l.stride);
  } else if (c.n_experts > 0) {  // a checkpoint: its experts are in expert_bytes, the MTP head's too
    const double moe_layers = double(c.n_layers + (w.mtp ? 1 : 0));
    b += double(w.expert_bytes) / (double(c.n_experts) * moe_layers) * double(c.top_k) * double(c.n_layers);
  }
  return b;
}

std::vector<int> random_ids(int n, int vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<int> ids(static_cast<size_t>(n));
  for (int& i : ids) i = id(gen);
  return ids;
}

// Seconds of one prompt of n tokens from an empty state.
double time_prompt(const Model& m, int n, unsigned seed) {
  const std::vector<int> ids = random_ids(n, m.config().vocab, seed);
  State state = m.new_state();
  const auto start = Clock::now();
  m.forward(ids.data(), n, state, {});
  return seconds(start, Clock::now());
}

// What a decode test times: n steps after `skip` untimed ones (and the first, which the prompt
// makes); `at_start` runs as the timed steps begin.
struct DecodeSpan {
  int n = 0, skip = 0;
  std::function<void()> at_start;
};

// Seconds of a span of decode steps after a one-token prompt, greedy, past any end-of-sequence
// token, from `state` (a context prefilled once, restored for each run).
double time_decode(const Model& m, State& state, const DecodeSpan& span, unsigned seed, const SpeculativeOptions& spec = {},
                   SpeculativeStats* spec_stats = nullptr, DraftTuner* tuner = nullptr) {
  Clock::time_point first;
  int tokens = 0;
  generate_greedy(m, state, random_ids(1, m.config().vocab, seed),
                  {.max_tokens = span.skip + span.n + 1, .stop_at_eos = false, .speculative = spec,
                   .speculative_stats = spec_stats, .tuner = tuner},
                  [&](int) {
                    if (tokens++ != span.skip) return;
                    if (span.at_start) span.at_start();
                    first = Clock::now();
                  });
  return seconds(first, Clock::now());
}

// The text workload's ids: `file` tokenized by the model's tokenizer, or the embedded model's
// where the model has none (a synth): its ids are valid in any vocabulary of 8192 or more.
std::vector<int> text_ids(const std::string& model_dir, const std::string& file) {
  const std::string own = model_dir + "/tokenizer.json";
  const std::string tok = std::filesystem::exists(own) ? own : std::string(kEmbeddedTokenizer);
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("{}: cannot read the text workload's file", file);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int> ids = Tokenizer::load(tok).encode(text.str());
  if (ids.size() < 2) fail("{}: the text workload needs a text of two tokens or more", file);
  return ids;
}

// The replay workload's steps from --routes-from, announced: its answers are not the model's.
std::vector<std::vector<std::vector<int>>> replay_routes(const Model& m, const std::string& path) {
  if (path.empty()) fail("--workload replay needs --routes-from FILE (a routing trace)");
  auto steps = replay_steps(load_route_traces(path, m.config().n_experts), m.config(), path);
  std::printf("REPLAY: tg<N>-replay routes every MoE layer by %s (%zu steps), not by its router: it times the "
              "expert pools under that routing, not the model\n",
              path.c_str(), steps.size());
  return steps;
}

// The first tier of the expert pools (VRAM on the GPU, the pools on the CPU) summed over layers;
// its hits, misses and stall time between two calls make a decode row's pool columns.
TierSummary first_tier(const Model& m) {
  const std::vector<PoolTier> tiers = m.executor().pool_tiers();
  return tiers.empty() ? TierSummary{} : summarize_tier(tiers[0]);
}

// Whether the first tier holds fewer slots than its layers have experts (decode streams them).
bool first_tier_streams(const Model& m) {
  const std::vector<PoolTier> tiers = m.executor().pool_tiers();
  return !tiers.empty() && size_t(summarize_tier(tiers[0]).slots) < tiers[0].layers.size() * size_t(m.config().n_experts);
}

// What the first tier counted between `before` and `now`: its moves, and where the hybrid
// decode ran its experts.
struct TierMoves {
  PoolStats pool;
  PlacementStats placed;
  TierMoves& operator+=(const TierMoves& o) {
    pool += o.pool;
    placed += o.placed;
    return *this;
  }
};
TierMoves tier_moves(const TierSummary& now, const TierSummary& before) {
  TierMoves d;
  const PoolStats &a = now.pool, &b = before.pool;
  d.pool.hits = a.hits - b.hits, d.pool.misses = a.misses - b.misses;
  d.pool.bytes_read = a.bytes_read - b.bytes_read, d.pool.stall_s = a.stall_s - b.stall_s;
  const PlacementStats &p = now.placed, &q = before.placed;
  d.placed = {p.gpu - q.gpu,
              p.copied - q.copied,
              p.cpu - q.cpu,
              p.cpu_busy_s - q.cpu_busy_s,
              p.cpu_wait_s - q.cpu_wait_s,
              p.gpu_wait_s - q.gpu_wait_s};
  return d;
}

// "  hit 0.62, stall 41 %": the first tier's hit rate over the timed steps and the share of
// their `seconds` the compute waited on it; where the CPU computed experts, ", cpu 30 %" of
// them and the GPU's wait for them. Empty where nothing was routed to a pool.
std::string pool_columns(const TierMoves& timed, double seconds) {
  const PoolStats& p = timed.pool;
  const PlacementStats& c = timed.placed;
  const uint64_t placed = c.gpu + c.copied + c.cpu;
  if (p.hits + p.misses == 0 && placed == 0) return {};
  std::string s = fmt::format("  hit {:.2f}, stall {:.0f} %", p.hit_rate(), seconds > 0 ? 100.0 * p.stall_s / seconds : 0.0);
  if (c.cpu > 0)
    s += fmt::format(", cpu {:.0f} % of experts, gpu wait {:.0f} %", 100.0 * double(c.cpu) / double(placed),
                     seconds > 0 ? 100.0 * c.gpu_wait_s / seconds : 0.0);
  return s;
}

// One line per tier of a model's expert pools: its slots, what the load put there, the link's
// measured rate.
void print_tiers(const Model& m) {
  for (const PoolTier& t : m.executor().pool_tiers()) {
    const TierSummary s = summarize_tier(t);
    const std::string load = s.load.whole    ? "every expert loaded"
                             : s.load.warmed ? fmt::format("{} experts warm-started", s.load.warmed)
                                             : std::string("filled as routed");
    const std::string link = s.measured_gb_s > 0 ? fmt::format(", link measured at {:.1f} GB/s", s.measured_gb_s) : "";
    const size_t experts = t.layers.size() * size_t(m.config().n_experts);
    fmt::print("tier {}: {} slots for {} experts over {} layers{}, {}{}\n", s.name, s.slots, experts, t.layers.size(),
               size_t(s.slots) < experts ? " (decode streams them)" : "", load, link);
    if (!t.placement.empty()) fmt::print("tier {}: misses placed {}\n", s.name, t.placement);
  }
}

// Seconds of a span of decode steps of workload w, from `state`.
double time_workload(const Model& m, State& state, const Workload& w, const DecodeSpan& span, unsigned seed) {
  Clock::time_point first;
  run_workload(m, state, w, span.skip + span.n + 1, seed, [&](int i) {
    if (i != span.skip) return;
    if (span.at_start) span.at_start();
    first = Clock::now();
  });
  return seconds(first, Clock::now());
}

// One line: how a per-layer LRU pool sees the workload's routing over n steps (untimed), beside
// what real 512-expert top-10 models show.
void print_routing_curve(const Model& m, const Workload& w, int n) {
  if (!m.experts() || n < 2) return;
  State state = m.new_state();
  std::vector<std::vector<std::vector<int>>> routes;
  run_workload(m, state, w, n, 1, {}, &routes);
  const RoutingCurve c = routing_curve(routes, m.config().n_experts, m.config().top_k);
  std::printf("routing of %s over %d tokens: LRU hit rate at 1/16, 1/8, 1/4, 1/2 of a layer's experts %.2f / %.2f / %.2f / "
              "%.2f, reused at the next token %.2f (real 512-expert top-10 models: ~0.67 at 1/8, ~0.81 at 1/4, ~0.45)\n",
              w.name(), n, c.hit[0], c.hit[1], c.hit[2], c.hit[3], c.reuse);
}

void add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Prompt and decode speed of a model beside the machine's memory bandwidth");
  struct Args {
    ModelArgs m;
    std::vector<int> prompts{16, 128, 512}, depths{0};
    int tokens = 64, skip = 0, repeat = 3;
    bool no_preload = false;
    std::string workloads = "uniform,text,greedy", text = kDefaultText, routes_from;
  };
  auto a = std::make_shared<Args>();
  add_model_options(cmd, a->m);
  add_speculative_options(cmd, a->m);
  cmd->add_option("--prompt", a->prompts, "Prompt lengths to time (pp<N>), comma-separated; 0 for none")
      ->delimiter(',')
      ->check(int_in(0, 1 << 20));
  cmd->add_option("--tokens", a->tokens, "Decode steps to time (tg<N>); 0 for none")->check(int_in(0, 1 << 20));
  cmd->add_option("--depth", a->depths,
                  "Context the decode test runs after (tg<N>@d<D>), comma-separated: a prompt of that many tokens, "
                  "prefilled once, untimed")
      ->delimiter(',')
      ->check(int_in(0, 1 << 24));
  cmd->add_option("--skip", a->skip,
                  "Decode steps run untimed before the timed ones (tg<N>+<skip>): a steady state, the pools filled")
      ->check(int_in(0, 1 << 20));
  cmd->add_option("--repeat", a->repeat, "Runs of each test; the median is reported")->check(int_in(1, 1000));
  cmd->add_option("--workload", a->workloads,
                  "What drives the decode test (tg<N>-<workload>), comma-separated: uniform (tokens sampled at "
                  "temperature 1: routing that changes every token), text (the tokens of --text, teacher-forced), "
                  "greedy (argmax: on random weights one expert set repeats, an upper bound; MTP drafts only here), "
                  "replay (--routes-from's routing in place of the router's)")
      ->capture_default_str()
      ->check(parses_with([](const std::string& s) { parse_workloads(s); }, "LIST"));
  cmd->add_option("--text", a->text, "The text workload's file (tokenized by the model's tokenizer, else the embedded model's)")
      ->capture_default_str()
      ->check(CLI::ExistingFile);
  cmd->add_option("--routes-from", a->routes_from,
                  "The replay workload's routing trace (simulate's format: docK.routes int16 [MoE layers, T, top_k]): "
                  "its expert ids replace the router's, so the pools see that routing; a benchmark of the pools only")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--no-preload", a->no_preload,
                "Do not read every expert at load where the pools hold them all, nor warm-start them (times the disk too)");
  cmd->callback([a] {
    ModelOptions opt = model_options(a->m);
    if (a->no_preload) {  // the pools fill as routing asks
      opt.load_whole = false;
      opt.warm_start = WarmStart::Off;
    }
    auto model = load_model(a->m.model, opt);
    opt.speculative = resolve_speculative(*model, opt.speculative, a->m.model);
    const Model& m = *model;
    std::printf("model %s, %s, %d threads, matmul target %s\n", a->m.model.c_str(),
                m.device() == Device::Cuda ? "cuda" : "cpu", ThreadPool::global().size(), cpu::matmul_quant_target());
    const cpu::Bandwidth bw = cpu::measure_bandwidth();
    std::printf("memory: read %.1f GB/s (%d threads, widest loads, prefetch %d B), copy %.1f GB/s (read + write)\n",
                bw.read_gbs, bw.threads, bw.prefetch, bw.copy_gbs);
    if (const WarmReport& w = m.warm_report(); w.loaded_whole)
      std::printf("every routed expert read into its pool at load: %.1f s\n", w.seconds);
    print_tiers(m);
    std::vector<Workload> workloads;
    for (const WorkloadKind k : parse_workloads(a->workloads)) {
      // The default text is in the source tree: an installed binary without it skips the workload.
      if (k == WorkloadKind::Text && a->text == kDefaultText && !std::filesystem::exists(a->text)) {
        std::printf("no text workload: %s is not here (--text FILE names one)\n", a->text.c_str());
        continue;
      }
      workloads.push_back({k, {}, {}});
      if (k == WorkloadKind::Text) workloads.back().text = text_ids(a->m.model, a->text);
      if (k == WorkloadKind::Replay) workloads.back().routes = replay_routes(m, a->routes_from);
    }
    if (!a->routes_from.empty() && std::none_of(workloads.begin(), workloads.end(), [](const Workload& w) {
          return w.kind == WorkloadKind::Replay;
        }))
      fail("--routes-from {}: names the replay workload's trace; add replay to --workload", a->routes_from);
    const double step_bytes = decode_bytes(m);
    std::printf("a decode step reads %.2f GB of weights\n\n%-16s %10s %10s %8s\n", step_bytes / 1e9, "test", "tok/s",
                "GB/s", "of read");
    // A short warm-up of each path: first-touch allocations stay out of the timings.
    time_prompt(m, 16, 0);
    if (a->tokens > 0) {
      State warm = m.new_state();
      time_decode(m, warm, {.n = 4}, 0);
    }
    for (const int n : a->prompts) {
      if (n <= 0) continue;
      std::vector<double> t;
      for (int r = 0; r < a->repeat; ++r) t.push_back(time_prompt(m, n, unsigned(r + 1)));
      std::printf("%-16s %10.2f\n", fmt::format("pp{}", n).c_str(), double(n) / median(t));
    }
    if (a->tokens > 0) {
      SpeculativeStats spec;
      DraftTuner tuner;  // kept across the runs, as a server's session keeps it
      const double kv_position = double(m.kv_bytes_per_position());
      std::printf("KV cache %s: %.0f B a position; at depth D a decode step reads D x that beside the weights\n",
                  m.kv_format().describe().c_str(), kv_position);
      const bool streams = first_tier_streams(m);  // the decode rows get the pool's columns
      for (const int depth : a->depths) {
        State context = m.new_state();
        if (depth > 0) m.forward(random_ids(depth, m.config().vocab, 7).data(), depth, context, {});
        const State::Checkpoint start = context.checkpoint();
        for (const Workload& w : workloads) {
          std::vector<double> t;
          TierMoves timed;
          TierSummary at_start;
          const DecodeSpan span{a->tokens, a->skip, [&] { at_start = first_tier(m); }};
          for (int r = 0; r < a->repeat; ++r) {
            context.restore(start);
            t.push_back(w.kind == WorkloadKind::Greedy
                            ? time_decode(m, context, span, unsigned(r + 1), opt.speculative, &spec, &tuner)
                            : time_workload(m, context, w, span, unsigned(r + 1)));
            timed += tier_moves(first_tier(m), at_start);
          }
          const double tps = double(a->tokens) / median(t);
          const double gbs = tps * (step_bytes + double(depth) * kv_position) / 1e9;
          const std::string name = fmt::format("tg{}{}{}-{}", a->tokens, a->skip > 0 ? fmt::format("+{}", a->skip) : "",
                                               depth > 0 ? fmt::format("@d{}", depth) : "", w.name());
          double total = 0;
          for (double x : t) total += x;
          std::printf("%-16s %10.2f %10.2f %8.2f%s\n", name.c_str(), tps, gbs, gbs / bw.read_gbs,
                      streams ? pool_columns(timed, total).c_str() : "");
        }
      }
      for (const Workload& w : workloads) print_routing_curve(m, w, a->tokens);
      print_speculative_stats(opt.speculative, spec, stdout);
    }
    std::fflush(stdout);
  });
}

}  // namespace

void register_bench_commands(CLI::App& app) { add_bench(app); }

}  // namespace ms::cli
