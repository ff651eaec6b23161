#include "runtime/decoder.h"

namespace ms {

int Decoder::run(State& state, int first, int max_steps, Sampler& sampler, const std::vector<int>& seen,
                 const OnStep& on_token) const {
  if (speculator_) return speculator_->run(state, first, max_steps, sampler, seen, routes_, on_token);
  const int vocab = model_.config().vocab;
  const DecodeOptions opt{.pick = [&] { return sampler.next(seen, vocab); }, .greedy = sampler.greedy(), .routes = routes_};
  return model_.decode(state, first, max_steps, opt, on_token);
}

}  // namespace ms
