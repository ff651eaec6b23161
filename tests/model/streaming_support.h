#pragma once
// What the streaming tests on the CPU (streaming_test.cpp) and the GPU (cuda_streaming_test.cpp)
// both run: a prompt's logits and greedy continuation, and the search for a forward that reads a
// damaged expert record.
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/generate.h"
#include "util/error.h"

namespace ms::test {

struct RunResult {
  std::vector<float> logits;  // every prompt position
  std::vector<int> tokens;    // greedy continuation
};

// The logits of `prompt` at every position, then n_new greedy tokens from a fresh state.
inline RunResult run_prompt(Model& model, const std::vector<int>& prompt, int n_new) {
  State s = model.new_state();
  RunResult r;
  r.logits = model.forward(prompt.data(), int(prompt.size()), s, {.all_logits = true}).logits;
  State g = model.new_state();
  r.tokens = generate_greedy(model, g, prompt, {.max_tokens = n_new, .stop_at_eos = false});
  return r;
}

// Runs forwards of up to 20 long, varied prompts (256 ids below 8192), each on model() with a
// fresh state, until one throws ms::Error; returns its message ("" when none threw), the prompt
// that threw (or the last one tried) in *prompt. Long prompts route most experts, so a damaged
// record is read within a few of them.
inline std::string first_forward_error(const std::function<Model&()>& model, std::vector<int>* prompt) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    Model& m = model();
    State s = m.new_state();
    prompt->clear();
    for (int t = 0; t < 256; ++t) prompt->push_back((t * 131 + attempt * 17) % 8192);
    try {
      m.forward(prompt->data(), int(prompt->size()), s);
    } catch (const Error& e) {
      return e.what();
    }
  }
  return "";
}

}  // namespace ms::test
