#pragma once
// A conversation's generation state: it keeps the KV/recurrent cache of what it has processed
// so that a prompt extending the previous one (the next chat turn) only processes the new part.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "runtime/stats.h"

namespace ms {

struct TokenTries;  // chat/json_constraint.h

class JsonSchema;

struct GenerationRequest {
  std::vector<int> prompt;
  int max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;  // user stop strings (not included in the output)
  bool ignore_eos = false;
  // Checked before every prompt chunk (Model::next_chunk) and every token: a set flag ends the
  // generation as "cancelled", a passed deadline as "timeout" (the prompt is not processed when
  // either holds at the start). A client gone, a server stopping: set `cancel` from any thread.
  const std::atomic<bool>* cancel = nullptr;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // MTP speculation for this request (checked by Session::generate); unset: the engine's default.
  std::optional<SpeculativeOptions> speculative;
  // Constrained decoding to one JSON object (chat/json_constraint.h): every pick keeps the text a
  // prefix of one, and the answer ends when it is complete. No speculation then.
  bool json_object = false;
  // A forced tool call (tool_choice "required" or a named function): the answer is one call, in
  // the <tool_call> form chat/tool_calls.h parses, to one of these, its arguments a JSON object.
  std::vector<std::string> forced_tools;
  std::vector<std::shared_ptr<const JsonSchema>> forced_tool_schemas;  // by forced_tools: a strict tool's parameters
  // tool_choice "auto" with strict tools: every tool's name, and by name a strict tool's
  // parameters (null for the others); the tool calls the answer makes are held to them.
  std::vector<std::string> auto_tools;
  std::vector<std::shared_ptr<const JsonSchema>> auto_tool_schemas;
  // Constrained decoding to a JSON text that validates against this schema (chat/json_schema.h).
  std::shared_ptr<const JsonSchema> json_schema;
};

struct GenerationResult {
  std::string text;
  std::vector<int> tokens;
  std::string finish_reason;  // "stop" (eos or stop string), "length", "cancelled" or "timeout"
  std::string stop_string;    // the stop string that ended the text, if one did
  int prompt_tokens = 0;
  int reused_tokens = 0;  // prompt tokens whose cache was reused, not recomputed
  double time_to_first_token_s = 0, prefill_tok_s = 0, decode_tok_s = 0;
  SpeculativeStats speculative;  // this generation's drafts, where it speculated
};

class Session {
 public:
  // With `stats`, every forward pass records its expert routes and the state's size there.
  explicit Session(const Engine& engine, EngineStats* stats = nullptr);

  // on_text receives complete UTF-8 text as it is made (stop strings held back); returning
  // false cancels the generation.
  GenerationResult generate(const GenerationRequest& req, const std::function<bool(const std::string&)>& on_text = {});
  void reset();
  const State& state() const { return state_; }

 private:
  // Rolls the state back to the longest cached prefix of `prompt`; returns its length.
  int reuse_prefix(const std::vector<int>& prompt);
  // Runs ids and, with `logits`, picks the next token with `sampler` where the logits are
  // (ForwardResult::token).
  ForwardResult forward(const int* ids, int T, Sampler& sampler, const std::vector<int>& seen, bool logits,
                        Speculator* spec);
  // The prompt's tokens from `from` on, chunk by chunk, the last chunk's result in `last`; stops
  // between chunks on req's cancel flag or deadline and says why (null: the whole prompt ran).
  // processed_ follows every chunk, so that an interrupted prompt leaves a coherent cache.
  const char* prefill(const GenerationRequest& req, int from, Sampler& sampler, const std::vector<int>& seen,
                      ForwardResult& last, Speculator* spec);
  // "cancelled" or "timeout" when req asks to stop now, else null.
  static const char* interruption(const GenerationRequest& req);
  // A step's routes and the state's size to the statistics, where there are any.
  void record_stats(const ForwardResult& fr);

  const Engine& engine_;
  EngineStats* stats_;
  State state_;
  std::vector<int> processed_;       // tokens the state has seen, in order
  State::Checkpoint prompt_end_;     // state right after the last prompt was processed
  std::vector<int> last_prompt_;
  DraftTuner tuner_;  // what --draft auto measured in earlier generations
  std::shared_ptr<const TokenTries> tries_;  // the vocabulary's, once a request was constrained
  std::chrono::steady_clock::time_point usage_saved_ = std::chrono::steady_clock::now();
};

}  // namespace ms
