// run and chat: text in, streamed text out.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/model_options.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "util/error.h"

namespace ms::cli {

namespace {

using ojson = nlohmann::ordered_json;

struct TextArgs {
  ModelArgs m;
  int max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false, stats = false, no_think = false;
  std::string system;
};

void add_text_options(CLI::App* cmd, TextArgs& a) {
  add_model_options(cmd, a.m, true);
  add_speculative_options(cmd, a.m);
  cmd->add_option("--max-tokens", a.max_tokens, "Most tokens to generate")->check(int_in(0, 1 << 30));
  cmd->add_option("--temperature", a.sampling.temperature, "Sampling temperature (0: greedy)")->check(real_in(0.0, 100.0));
  cmd->add_option("--top-k", a.sampling.top_k, "Sample from the k most likely tokens (0: off)")->check(int_in(0, 1 << 30));
  cmd->add_option("--top-p", a.sampling.top_p, "Nucleus sampling mass (1: off)")->check(real_in(0.0, 1.0, true));
  cmd->add_option("--min-p", a.sampling.min_p, "Drop tokens below min-p x the top probability")->check(real_in(0.0, 1.0));
  cmd->add_option("--repetition-penalty", a.sampling.repetition_penalty, "Penalty on seen tokens (1: off)")
      ->check(real_in(0.0, 100.0, true));
  cmd->add_option("--presence-penalty", a.sampling.presence_penalty, "Subtracted once from each seen token's logit")
      ->check(real_in(-100.0, 100.0));
  cmd->add_option("--frequency-penalty", a.sampling.frequency_penalty, "Subtracted per occurrence of a seen token")
      ->check(real_in(-100.0, 100.0));
  cmd->add_option("--seed", a.sampling.seed, "Random seed (same seed, same output)")->check(int_in(0, INT64_MAX));
  cmd->add_option("--stop", a.stop, "Stop when this text appears (repeatable)")->check(non_empty());
  cmd->add_flag("--ignore-eos", a.ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--stats", a.stats, "Print prompt and decode tok/s and time to first token at the end");
  cmd->add_option("--system", a.system, "System prompt (chat template)");
  cmd->add_flag("--no-think", a.no_think, "Render the chat template with enable_thinking=false");
}

GenerationRequest make_request(const TextArgs& a, std::vector<int> prompt) {
  return {std::move(prompt), a.max_tokens, a.sampling, a.stop, a.ignore_eos};
}

bool print_piece(const std::string& piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
  return true;
}

void print_stats(const Engine& engine, const Session& session, const GenerationResult& r) {
  std::fprintf(stderr, "\n[prompt %d tokens (%d reused), %.1f tok/s | first token %.3f s | %zu tokens, decode %.1f tok/s | %s]\n",
               r.prompt_tokens, r.reused_tokens, r.prefill_tok_s, r.time_to_first_token_s, r.tokens.size(),
               r.decode_tok_s, r.finish_reason.c_str());
  print_speculative_stats(engine.speculative(), r.speculative, stderr);
  print_kv_stats(engine.model(), session.state().kv_bytes(), session.state().position(), stderr);
}

// The conversation's prompt tokens; what the user typed is tokenized as text (see marked_text.h).
std::vector<int> chat_prompt(const Engine& engine, const ojson& messages, bool no_think) {
  const ChatTemplate* tmpl = engine.chat_template();
  if (!tmpl) fail("{}: tokenizer_config.json has no chat_template, so --chat / chat cannot be used", engine.dir());
  ojson extra = ojson::object();
  if (no_think) extra["enable_thinking"] = false;
  return engine.tokenizer().encode(tmpl->render_marked(messages, nullptr, true, extra));
}

void add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt, streamed to stdout");
  auto a = std::make_shared<TextArgs>();
  auto prompt = std::make_shared<std::string>();
  auto chat = std::make_shared<bool>(false);
  add_text_options(cmd, *a);
  cmd->add_option("--prompt", *prompt, "Prompt text")->required()->check(non_empty());
  cmd->add_flag("--chat", *chat, "Wrap the prompt in the model's chat template as a user message");
  cmd->callback([a, prompt, chat] {
    a->sampling.validate();
    auto engine = Engine::load(a->m.model, model_options(a->m));
    std::vector<int> ids;
    if (*chat) {
      ojson messages = ojson::array();
      if (!a->system.empty()) messages.push_back({{"role", "system"}, {"content", a->system}});
      messages.push_back({{"role", "user"}, {"content", *prompt}});
      ids = chat_prompt(*engine, messages, a->no_think);
    } else {
      ids = engine->tokenizer().encode(*prompt);  // a plain prompt's special-token text is recognised, as in HF
    }
    Session session(*engine);
    GenerationResult r = session.generate(make_request(*a, std::move(ids)), print_piece);
    std::printf("\n");
    if (a->stats) {
      print_stats(*engine, session, r);
      print_expert_stats(engine->model(), stderr);
    }
  });
}

void add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Interactive chat in the terminal (/reset clears, /exit or EOF quits)");
  auto a = std::make_shared<TextArgs>();
  add_text_options(cmd, *a);
  cmd->callback([a] {
    a->sampling.validate();
    auto engine = Engine::load(a->m.model, model_options(a->m));
    Session session(*engine);
    ojson messages = ojson::array();
    auto start = [&] {
      messages = ojson::array();
      if (!a->system.empty()) messages.push_back({{"role", "system"}, {"content", a->system}});
    };
    start();
    std::string line;
    for (;;) {
      std::fputs("> ", stderr);
      if (!std::getline(std::cin, line) || line == "/exit") break;
      if (line == "/reset") {
        start();
        session.reset();
        continue;
      }
      if (line.empty()) continue;
      messages.push_back({{"role", "user"}, {"content", line}});
      // The session keeps the cache of the conversation so far: only the new turn is processed.
      GenerationResult r = session.generate(make_request(*a, chat_prompt(*engine, messages, a->no_think)), print_piece);
      std::printf("\n");
      if (a->stats) print_stats(*engine, session, r);
      messages.push_back({{"role", "assistant"}, {"content", r.text}});
    }
  });
}

}  // namespace

void register_text_commands(CLI::App& app) {
  add_run(app);
  add_chat(app);
}

}  // namespace ms::cli
