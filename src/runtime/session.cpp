#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "chat/json_constraint.h"
#include "chat/json_schema.h"
#include "runtime/decoder.h"
#include "util/error.h"

namespace ms {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kUsageSaveInterval = std::chrono::seconds(60);
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool has_prefix(const std::vector<int>& v, const std::vector<int>& prefix) {
  return prefix.size() <= v.size() && std::equal(prefix.begin(), prefix.end(), v.begin());
}

// Text that is safe to emit: everything except a tail that could still grow into a stop string.
size_t safe_length(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return text.size() - hold;
}

}  // namespace

Session::Session(const Engine& engine, EngineStats* stats)
    : engine_(engine), stats_(stats), state_(engine.model().new_state()) {
  prompt_end_ = state_.checkpoint();
}

void Session::reset() {
  state_.reset();
  processed_.clear();
  last_prompt_.clear();
  prompt_end_ = state_.checkpoint();
}

int Session::reuse_prefix(const std::vector<int>& prompt) {
  // A prompt must leave at least one token to process: the logits come from it.
  auto usable = [&](const std::vector<int>& cached) { return cached.size() < prompt.size() && has_prefix(prompt, cached); };
  if (!processed_.empty() && usable(processed_)) return int(processed_.size());
  if (!last_prompt_.empty() && usable(last_prompt_)) {
    state_.restore(prompt_end_);
    processed_ = last_prompt_;
    return int(processed_.size());
  }
  reset();
  return 0;
}

ForwardResult Session::forward(const int* ids, int T, Sampler& sampler, const std::vector<int>& seen, bool logits,
                               Speculator* spec) {
  ForwardOptions opt;
  opt.routes = stats_ != nullptr;
  opt.hidden = spec != nullptr;  // the MTP head's rows take them
  opt.logits = logits;
  const int vocab = engine_.model().config().vocab;
  if (logits) opt.pick = [&] { return sampler.next(seen, vocab); };
  ForwardResult fr = engine_.model().forward(ids, T, state_, opt);
  if (spec) spec->prompt_chunk(state_, ids, T, fr);
  record_stats(fr);
  return fr;
}

const char* Session::prefill(const GenerationRequest& req, int from, Sampler& sampler, const std::vector<int>& seen,
                             ForwardResult& last, Speculator* spec) {
  const Model& model = engine_.model();
  const int T = int(req.prompt.size());
  for (int done = from; done < T;) {
    if (done > from)
      if (const char* why = interruption(req)) return why;
    const int n = model.next_chunk(T - done);
    last = forward(req.prompt.data() + done, n, sampler, seen, done + n == T, spec);
    done += n;
    processed_.assign(req.prompt.begin(), req.prompt.begin() + done);
  }
  return nullptr;
}

const char* Session::interruption(const GenerationRequest& req) {
  if (req.cancel && req.cancel->load()) return "cancelled";
  if (Clock::now() >= req.deadline) return "timeout";
  return nullptr;
}

void Session::record_stats(const ForwardResult& fr) {
  if (!stats_) return;
  stats_->record_routes(fr.routes);
  stats_->set_state_bytes(state_.bytes(), state_.kv_bytes(), state_.position());
}

GenerationResult Session::generate(const GenerationRequest& req, const std::function<bool(const std::string&)>& on_text) {
  if (req.prompt.empty()) fail("the prompt is empty");
  if (req.max_tokens < 0) fail("max_tokens must be >= 0, is {}", req.max_tokens);
  engine_.model().check_ids(req.prompt.data(), int(req.prompt.size()));  // before any chunk runs
  for (const auto& s : req.stop)
    if (s.empty()) fail("a stop string is empty");
  Sampler sampler(req.sampling);
  // Constrained decoding (chat/json_constraint.h): a forced tool call, a JSON schema, JSON mode, or
  // free text whose tool calls are held to the strict tools' schemas.
  const Tokenizer& tok = engine_.tokenizer();
  std::unique_ptr<PickConstraint> constraint;
  if (!req.forced_tools.empty())
    constraint = std::make_unique<ToolCallConstraint>(tok, engine_.eos_ids(),
                                                      ToolCallAcceptor(req.forced_tools, req.forced_tool_schemas));
  else if (req.json_schema)
    constraint = std::make_unique<SchemaConstraint>(tok, engine_.eos_ids(), SchemaAcceptor(req.json_schema));
  else if (req.json_object)
    constraint = std::make_unique<JsonConstraint>(tok, engine_.eos_ids(), JsonAcceptor());
  else if (!req.auto_tools.empty())
    constraint = std::make_unique<AutoToolConstraint>(tok, engine_.eos_ids(),
                                                      AutoToolAcceptor(req.auto_tools, req.auto_tool_schemas));
  if (constraint) {
    tries_ = token_tries(tok);  // kept: the next constrained request walks the same tries
    sampler.constrain([&constraint] { return constraint->allowed().data(); });
  }
  const SpeculativeOptions spec_opt =
      resolve_speculative(engine_.model(), req.speculative.value_or(engine_.speculative()), engine_.dir());
  std::optional<Speculator> spec;
  if (spec_opt.mtp && !constraint) spec.emplace(engine_.model(), spec_opt, &tuner_);

  GenerationResult res;
  res.prompt_tokens = int(req.prompt.size());
  if (const char* why = interruption(req)) {
    res.finish_reason = why;
    return res;
  }
  const auto start = Clock::now();
  res.reused_tokens = reuse_prefix(req.prompt);
  const int fresh = int(req.prompt.size()) - res.reused_tokens;
  std::vector<int> seen = req.prompt;  // what the penalties look at
  ForwardResult fr;
  if (const char* why = prefill(req, res.reused_tokens, sampler, seen, fr, spec ? &*spec : nullptr)) {
    // The state holds the prompt's prefix processed_ names; the last prompt's checkpoint stays
    // valid, since this one's tokens went in at or past its end.
    res.finish_reason = why;  // and no first token: its time stays 0
    return res;
  }
  last_prompt_ = req.prompt;
  prompt_end_ = state_.checkpoint();
  res.time_to_first_token_s = seconds_since(start);
  res.prefill_tok_s = fresh / std::max(1e-9, res.time_to_first_token_s);

  StreamDecoder decoder(engine_.tokenizer());
  std::string pending;  // decoded, not yet emitted
  const char* interrupted = nullptr;
  auto emit = [&](size_t n) {
    if (n == 0) return;
    std::string piece = pending.substr(0, n);
    pending.erase(0, n);
    res.text += piece;
    if (on_text && !on_text(piece)) interrupted = "cancelled";
  };

  const auto decode_start = Clock::now();
  res.finish_reason = "length";
  // Takes the next token; whether to make another.
  auto accept = [&](int next) {
    res.tokens.push_back(next);
    seen.push_back(next);
    if (constraint) constraint->accept(next);
    if (!req.ignore_eos && engine_.is_eos(next)) {
      res.finish_reason = "stop";
      return false;
    }
    pending += decoder.push(next);
    size_t hit = std::string::npos;
    for (const auto& s : req.stop)
      if (const size_t at = pending.find(s); at < hit) hit = at, res.stop_string = s;
    if (hit != std::string::npos) {
      pending.resize(hit);
      emit(pending.size());
      res.finish_reason = "stop";
      return false;
    }
    emit(safe_length(pending, req.stop));
    if (!interrupted) interrupted = interruption(req);
    return !interrupted && int(res.tokens.size()) < req.max_tokens;
  };
  if (req.max_tokens > 0 && accept(fr.token)) {
    const size_t first = res.tokens.size() - 1;
    const int steps = Decoder(engine_.model(), stats_ != nullptr, spec ? &*spec : nullptr)
                          .run(state_, res.tokens.back(), req.max_tokens - int(res.tokens.size()), sampler, seen,
                               [&](const ForwardResult& step) {
                                 record_stats(step);
                                 return accept(step.token);
                               });
    processed_.insert(processed_.end(), res.tokens.begin() + std::ptrdiff_t(first),
                      res.tokens.begin() + std::ptrdiff_t(first) + steps);
  }
  if (interrupted) res.finish_reason = interrupted;
  // A cut-off answer keeps what it has, held-back text included; a cancelled one has no reader.
  if (res.finish_reason == "length" || res.finish_reason == "timeout") {
    pending += decoder.flush();
    emit(pending.size());
  }
  if (spec) {
    res.speculative = spec->stats();
    if (stats_) stats_->record_speculative(res.speculative);
  }
  const int decoded = std::max(0, int(res.tokens.size()) - 1);
  res.decode_tok_s = decoded / std::max(1e-9, seconds_since(decode_start));
  if (Clock::now() - usage_saved_ > kUsageSaveInterval) {  // a long-running server or chat keeps its history current
    engine_.save_usage();
    usage_saved_ = Clock::now();
  }
  return res;
}

}  // namespace ms
