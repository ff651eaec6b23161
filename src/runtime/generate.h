#pragma once
// Token generation on top of the model's forward pass: one batched prefill, then cached decode.
#include <functional>
#include <vector>

#include "model/model.h"
#include "runtime/speculative.h"

namespace ms {

struct GenerateOptions {
  int max_tokens = 32;
  bool stop_at_eos = true;
  SpeculativeOptions speculative;  // MTP drafts (resolve_speculative first); the output is the same
  SpeculativeStats* speculative_stats = nullptr;  // where given, gets the speculation's counts
  DraftTuner* tuner = nullptr;  // --draft auto's measurements from earlier generations, kept for later ones
};

// Greedy continuation of `prompt` from the state's position. on_token (optional) sees each
// token as it is made. Returns the generated ids (an end-of-sequence id included). Where the
// backend decodes ahead (Model::decode), the state has also processed an end-of-sequence id
// that stopped it.
std::vector<int> generate_greedy(const Model& model, State& state, const std::vector<int>& prompt,
                                 const GenerateOptions& opt, const std::function<void(int)>& on_token = {});

}  // namespace ms
