#include "runtime/generate.h"

#include <algorithm>
#include <optional>

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
  std::optional<Speculator> spec;
  if (opt.speculative.mtp) spec.emplace(model, opt.speculative, opt.tuner);
  ForwardOptions fo{.hidden = spec.has_value()};
  fo.pick = [&] { return greedy.next(no_penalties, cfg.vocab); };
  ForwardResult r;
  if (!spec) {
    r = model.forward(prompt.data(), int(prompt.size()), state, fo);
  } else {  // chunk by chunk, each chunk's MTP rows after it
    model.check_ids(prompt.data(), int(prompt.size()));
    for (int done = 0, T = int(prompt.size()); done < T;) {
      const int n = model.next_chunk(T - done);
      ForwardOptions o = fo;
      if (done + n < T) {  // only the last chunk's pick is needed
        o.pick = nullptr;
        o.logits = false;
      }
      r = model.forward(prompt.data() + done, n, state, o);
      spec->prompt_chunk(state, prompt.data() + done, n, r);
      done += n;
    }
  }
  // Takes a token; whether to make another.
  auto accept = [&](int next) {
    out.push_back(next);
    if (on_token) on_token(next);
    const bool eos = std::find(cfg.eos_ids.begin(), cfg.eos_ids.end(), next) != cfg.eos_ids.end();
    return !(opt.stop_at_eos && eos) && int(out.size()) < opt.max_tokens;
  };
  if (opt.max_tokens <= 0 || !accept(r.token)) return out;
  Decoder(model, false, spec ? &*spec : nullptr).run(state, out.back(), opt.max_tokens - int(out.size()), greedy, no_penalties,
                     [&](const ForwardResult& step) { return accept(step.token); });
  if (spec && opt.speculative_stats) opt.speculative_stats->add(spec->stats());
  return out;
}

}  // namespace ms
