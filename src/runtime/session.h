#pragma once
// A conversation's generation state: it keeps the KV/recurrent cache of what it has processed
// so that a prompt extending the previous one (the next chat turn) only processes the new part.
#include <functional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace ms {

struct GenerationRequest {
  std::vector<int> prompt;
  int max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;  // user stop strings (not included in the output)
  bool ignore_eos = false;
};

struct GenerationResult {
  std::string text;
  std::vector<int> tokens;
  std::string finish_reason;  // "stop" (eos or stop string), "length", or "cancelled"
  int prompt_tokens = 0;
  int reused_tokens = 0;  // prompt tokens whose cache was reused, not recomputed
  double time_to_first_token_s = 0, prefill_tok_s = 0, decode_tok_s = 0;
};

class Session {
 public:
  explicit Session(const Engine& engine);

  // on_text receives complete UTF-8 text as it is made (stop strings held back); returning
  // false cancels the generation.
  GenerationResult generate(const GenerationRequest& req, const std::function<bool(const std::string&)>& on_text = {});
  void reset();

 private:
  // Rolls the state back to the longest cached prefix of `prompt`; returns its length.
  int reuse_prefix(const std::vector<int>& prompt);

  const Engine& engine_;
  State state_;
  std::vector<int> processed_;       // tokens the state has seen, in order
  State::Checkpoint prompt_end_;     // state right after the last prompt was processed
  std::vector<int> last_prompt_;
};

}  // namespace ms
