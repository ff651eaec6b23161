#include "model/executor.h"

namespace ms {

int Executor::decode_stepwise(State& state, int first, int max_steps, const DecodeOptions& opt,
                              const OnStep& on_step) const {
  const ForwardOptions fo{.routes = opt.routes, .pick = opt.pick};
  int token = first, steps = 0;
  while (steps < max_steps) {
    ForwardResult r = forward(&token, 1, state, fo);
    state.advance(1);
    ++steps;
    if (!on_step(r)) break;
    token = r.token;
  }
  return steps;
}

}  // namespace ms
