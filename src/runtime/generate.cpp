#include "runtime/generate.h"

#include <algorithm>

#include "runtime/sampler.h"
#include "util/error.h"

namespace ms {

std::vector<int> generate_greedy(const Model& model, State& state, const std::vector<int>& prompt,
                                 const GenerateOptions& opt, const std::function<void(int)>& on_token) {
  if (prompt.empty()) fail("generation needs a prompt of at least one token");
  const ModelConfig& cfg = model.config();
  std::vector<int> out;
  Sampler greedy({});
  const std::vector<int> no_penalties;
  ForwardOptions fo;
  fo.sample = [&](const float* logits, bool on_device) { return greedy.sample_at(logits, cfg.vocab, no_penalties, on_device); };
  ForwardResult r = model.forward(prompt.data(), int(prompt.size()), state, fo);
  while (int(out.size()) < opt.max_tokens) {
    const int next = r.token;
    out.push_back(next);
    if (on_token) on_token(next);
    const bool eos = std::find(cfg.eos_ids.begin(), cfg.eos_ids.end(), next) != cfg.eos_ids.end();
    if ((opt.stop_at_eos && eos) || int(out.size()) == opt.max_tokens) break;
    r = model.forward(&next, 1, state, fo);
  }
  return out;
}

}  // namespace ms
