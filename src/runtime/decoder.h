#pragma once
// The one decode loop: greedy generation, the CLI's run and chat sessions and the server all
// decode through Decoder::run, and each backend runs its steps the fast way it has behind it
// (Model::decode: the CPU a forward a step, the GPU a replayed graph, greedy steps run ahead).
//
// Speculative decoding plugs in here, not beside it: run() would draft K tokens (the MTP head,
// Model::mtp_forward), verify them and the one after in one forward (ForwardOptions::all_logits),
// hand on_token the prefix the sampler accepts, and roll the state back past the rest
// (State::checkpoint / restore), with the same contract to its callers.
#include <functional>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace ms {

class Decoder {
 public:
  // routes: each step's ForwardResult carries its routed ids (expert statistics).
  explicit Decoder(const Model& model, bool routes = false) : model_(model), routes_(routes) {}

  // Decodes from `first`, a token the state has not processed: each step runs one token and
  // picks the next with `sampler`, whose penalties look at `seen` (the caller's on_token adds
  // each token it takes). on_token gets each step's result in turn (its token) and returns
  // whether to go on; at most max_steps steps run. Returns the steps run, by which the state
  // advanced: every token on_token got but the last, and that one too where the backend ran
  // ahead (Model::decode).
  int run(State& state, int first, int max_steps, Sampler& sampler, const std::vector<int>& seen,
          const OnStep& on_token) const;

 private:
  const Model& model_;
  bool routes_;
};

}  // namespace ms
