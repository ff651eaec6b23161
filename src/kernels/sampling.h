#pragma once
// One token pick as the kernels carry it out (cpu::sample, cuda::sample): everything the sampler
// decides before the logits exist, so that the pick runs wherever the logits are.
#include <cstdint>
#include <vector>

namespace ms {

// SamplingParams (runtime/sampler.h) less the seed: the sampler owns the RNG.
struct SampleArgs {
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f, min_p = 0.f, repetition_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
};

struct PickInputs {
  SampleArgs args;
  std::vector<int> tokens;  // the distinct seen tokens the penalties apply to (in 0..vocab-1) ...
  std::vector<int> counts;  // ... and how often each was seen
  double r = 0;             // the RNG's draw, uniform in [0, 1); unused when temperature is 0
  // Constrained decoding: allowed[id] is 0 for each token the pick may not make ([vocab]); null:
  // any. Owned by the caller for the pick's duration.
  const uint8_t* allowed = nullptr;

  // Temperature 0, no penalties, no constraint: the pick is the first maximum of the logits.
  bool greedy() const { return args.temperature == 0.f && tokens.empty() && !allowed; }
};

}  // namespace ms
