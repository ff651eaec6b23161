#include "runtime/generate.h"

#include <algorithm>

#include "runtime/decoder.h"
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
  fo.pick = [&] { return greedy.next(no_penalties, cfg.vocab); };
  const ForwardResult r = model.forward(prompt.data(), int(prompt.size()), state, fo);
  // Takes a token; whether to make another.
  auto accept = [&](int next) {
    out.push_back(next);
    if (on_token) on_token(next);
    const bool eos = std::find(cfg.eos_ids.begin(), cfg.eos_ids.end(), next) != cfg.eos_ids.end();
    return !(opt.stop_at_eos && eos) && int(out.size()) < opt.max_tokens;
  };
  if (opt.max_tokens <= 0 || !accept(r.token)) return out;
  Decoder(model).run(state, out.back(), opt.max_tokens - int(out.size()), greedy, no_penalties,
                     [&](const ForwardResult& step) { return accept(step.token); });
  return out;
}

}  // namespace ms
