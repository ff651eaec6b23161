#pragma once
// The one decode loop: greedy generation, the CLI's run and chat sessions and the server all
// decode through Decoder::run, and each backend runs its steps the fast way it has behind it
// (Model::decode: the CPU a forward a step, the GPU a replayed graph, greedy steps run ahead).
//
// Speculative decoding plugs in here, not beside it: with a Speculator (runtime/speculative.h)
// run() drafts K tokens with the MTP head, verifies them and the one before them in one forward,
// hands on_token the prefix the sampler accepts and rolls the state back past the rest, with the
// same contract to its callers.
#include <functional>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace ms {

class Decoder {
 public:
  // routes: each step's ForwardResult carries its routed ids (expert statistics).
  // speculator: where given, steps draft and verify through it.
  explicit Decoder(const Model& model, bool routes = false, Speculator* speculator = nullptr)
      : model_(model), routes_(routes), speculator_(speculator) {}

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
  Speculator* speculator_;
};

}  // namespace ms
