// logits, generate, inspect: the commands that later tooling calls (their flags are stable).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/model_options.h"
#include "backends/load.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "util/error.h"
#include "util/memory.h"

namespace ms::cli {

namespace {

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(int(v));
    } catch (const std::exception&) {
      throw CLI::ValidationError("--ids", fmt::format("'{}' is not a token id (expected e.g. 3,17,5)", item));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

void add_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "Write the logits of one forward pass over the given ids");
  struct Args {
    ModelArgs m;
    std::string ids, out, mtp_hidden = "pre";
    bool mtp = false, stats = false;
  };
  auto a = std::make_shared<Args>();
  add_model_options(cmd, a->m);
  cmd->add_flag("--stats", a->stats, "Print expert pool statistics at the end");
  cmd->add_option("--ids", a->ids, "Comma-separated token ids")->required();
  cmd->add_option("--out", a->out, "Output .safetensors file (tensor 'logits' [T, vocab])")->required()->check(non_empty());
  cmd->add_flag("--mtp", a->mtp, "Also write 'mtp_logits' [T-1, vocab] from the MTP head");
  cmd->add_option("--mtp-hidden", a->mtp_hidden, "Hidden state the MTP head reads: pre or post the final norm")
      ->check(CLI::IsMember({"pre", "post"}));
  cmd->callback([a] {
    std::vector<int> ids = parse_ids(a->ids);
    auto model = load_model(a->m.model, model_options(a->m));
    const int T = int(ids.size()), V = model->config().vocab;
    State state = model->new_state();
    ForwardResult r = model->forward(ids.data(), T, state, {.all_logits = true, .hidden = a->mtp});
    std::vector<TensorData> out{make_f32_tensor("logits", {T, V}, r.logits.data())};
    if (a->mtp) {
      if (!model->has_mtp()) fail("{}: --mtp asked for, but the model has no MTP head", a->m.model);
      if (T < 2) fail("--mtp needs at least two ids");
      const auto& h = a->mtp_hidden == "pre" ? r.hidden_pre_norm : r.hidden_post_norm;
      std::vector<float> m = model->mtp_forward(h.data(), ids.data() + 1, T - 1, 0, state);
      out.push_back(make_f32_tensor("mtp_logits", {T - 1, V}, m.data()));
    }
    write_safetensors(a->out, out);
    if (a->stats) {
      print_kv_stats(*model, state.kv_bytes(), state.position(), stderr);
      print_expert_stats(*model, stderr);
    }
  });
}

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Greedy generation from token ids; prints the new ids");
  struct Args {
    ModelArgs m;
    std::string ids;
    int max_tokens = 32;
    bool ignore_eos = false, stats = false;
  };
  auto a = std::make_shared<Args>();
  add_model_options(cmd, a->m);
  add_speculative_options(cmd, a->m);
  cmd->add_flag("--stats", a->stats, "Print prefill/decode timing and expert pool statistics at the end");
  cmd->add_option("--ids", a->ids, "Comma-separated prompt token ids")->required();
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens to generate")->check(int_in(1, INT32_MAX));
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past an end-of-sequence token");
  cmd->callback([a] {
    std::vector<int> ids = parse_ids(a->ids);
    ModelOptions opt = model_options(a->m);
    auto model = load_model(a->m.model, opt);
    opt.speculative = resolve_speculative(*model, opt.speculative, a->m.model);
    State state = model->new_state();
    SpeculativeStats spec;
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    Clock::time_point first;  // the first token ends the prefill
    std::vector<int> out = generate_greedy(*model, state, ids,
                                           {.max_tokens = a->max_tokens,
                                            .stop_at_eos = !a->ignore_eos,
                                            .speculative = opt.speculative,
                                            .speculative_stats = &spec},
                                           [&](int) {
                                             if (first == Clock::time_point{}) first = Clock::now();
                                           });
    const auto end = Clock::now();
    std::printf("%s\n", join_ids(out).c_str());
    save_usage_or_warn(*model);
    if (a->stats) {
      const double prefill_s = std::chrono::duration<double>(first - start).count();
      const double decode_s = std::chrono::duration<double>(end - first).count();
      const size_t decoded = out.size() - 1;  // the first token comes from the prefill
      std::fprintf(stderr, "prompt %zu tokens, prefill %.3f s (%.1f tok/s) | %zu tokens, decode %.3f s (%.2f tok/s) | total %.3f s\n",
                   ids.size(), prefill_s, double(ids.size()) / prefill_s, out.size(), decode_s,
                   decode_s > 0 ? double(decoded) / decode_s : 0.0, prefill_s + decode_s);
      print_speculative_stats(opt.speculative, spec, stderr);
      print_kv_stats(*model, state.kv_bytes(), state.position(), stderr);
      print_expert_stats(*model, stderr);
    }
  });
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

// The KV bytes a position takes at k_bits, v_bits (group 64).
std::string kv_position(const Model& m, int k_bits, int v_bits) {
  KvFormat f;
  f.k.bits = k_bits;
  f.v.bits = v_bits;
  return human_bytes(double(m.kv_bytes_per_position(&f)));
}

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Describe a model: architecture, layers, parameters and bytes");
  auto model_dir = std::make_shared<std::string>();
  cmd->add_option("--model", *model_dir, "Model directory")->required()->check(non_empty());
  cmd->callback([model_dir] {
    ModelOptions opt;
    opt.load_whole = false;  // describing a model reads none of its experts
    auto model = load_model(*model_dir, opt);
    const ModelConfig& c = model->config();
    const ModelWeights& w = model->weights();
    std::string types;
    for (int l = 0; l < c.n_layers; ++l)
      types += fmt::format("{}{}", l ? " " : "", c.layer_types[size_t(l)] == LayerType::FullAttention ? "full" : "linear");
    fmt::print("architecture   {}\n", c.architecture);
    fmt::print("layers         {} [{}]\n", c.n_layers, types);
    fmt::print("hidden         {}  vocab {}  heads {}/{} x {}  rope theta {} (rotary dims {})\n", c.hidden, c.vocab,
               c.n_heads, c.n_kv_heads, c.head_dim, c.rope_theta, c.rotary_dim());
    if (c.arch == Arch::Qwen3Next)
      fmt::print("linear attn    key heads {} x {}, value heads {} x {}, conv kernel {}\n", c.lin_k_heads, c.lin_k_dim,
                 c.lin_v_heads, c.lin_v_dim, c.conv_kernel);
    fmt::print("experts        {} per MoE layer, top-{}, width {}{}\n", c.n_experts, c.top_k, c.moe_inter,
               c.shared_inter ? fmt::format(", shared expert width {}", c.shared_inter) : "");
    fmt::print("mtp head       {}\n", model->has_mtp() ? "yes" : "no");
    fmt::print("KV cache       {} a position (float32); --kv-bits 16,16: {}, 8,8: {}, 4,3: {}\n",
               human_bytes(double(model->kv_bytes_per_position())), kv_position(*model, 16, 16),
               kv_position(*model, 8, 8), kv_position(*model, 4, 3));
    if (const ExpertStore* experts = model->experts()) {
      const std::string profile = default_pool_profile(*model_dir);
      fmt::print("pool profile   {}\n", profile.empty() ? "none" : profile + " (used by default)");
      const UsageFiles usage = usage_files(*model_dir, experts->index(), "");
      std::string warning;
      const auto history = read_usage(usage.read, experts->index(), &warning);
      fmt::print("usage history  {}\n", history ? fmt::format("{} ({} runs; --warm-start reads its hottest experts)", usage.read, history->runs)
                                        : !warning.empty() ? warning
                                                           : fmt::format("none yet ({})", usage.write));
      if (!usage.note.empty()) fmt::print("               {}\n", usage.note);
      const HostBudget budget = default_host_budget();
      fmt::print("memory budget  {} from {} (the CPU's, where no --memory is given: pools are sized to it where the "
                 "model does not fit it whole)\n", format_bytes(budget.bytes), budget.source);
      fmt::print("format         engine directory, version {}{}\n", experts->index().version,
                 experts->index().version < 2 ? " (records without headers, no dense checksums: only the expert records are "
                                                "checked)"
                                              : "");
    }
    fmt::print("parameters     dense {} ({})  experts {} ({})  total {}\n", w.dense_params, human_bytes(double(w.dense_bytes)),
               w.expert_params, human_bytes(double(w.expert_bytes)), w.dense_params + w.expert_params);
  });
}

}  // namespace

void register_model_commands(CLI::App& app) {
  add_logits(app);
  add_generate(app);
  add_inspect(app);
}

}  // namespace ms::cli
