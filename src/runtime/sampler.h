#pragma once
// Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, a seeded RNG.
#include <cstdint>
#include <memory>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/sample.h"
#include "kernels/sampling.h"

namespace ms {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy
  int top_k = 0;            // 0: off
  float top_p = 1.f;        // 1: off
  float min_p = 0.f;        // 0: off
  float repetition_penalty = 1.f;  // HF-style: logit / p if > 0, logit * p otherwise, per seen token
  float presence_penalty = 0.f;    // OpenAI-style: minus once per seen token
  float frequency_penalty = 0.f;   // minus per occurrence
  uint64_t seed = 0;

  void validate() const;  // throws naming the parameter that is out of range
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // What the next pick needs, the tokens seen so far (prompt and generated) given for the
  // penalties; takes the RNG's draw where the temperature is above 0. The backend that holds
  // the logits carries the pick out (Backend::pick: cpu::sample or cuda::sample).
  PickInputs next(const std::vector<int>& seen, int vocab);
  // next() without the draw: what the distribution of a pick depends on (speculative sampling).
  PickInputs inputs(const std::vector<int>& seen, int vocab) const;
  // A uniform draw in [0, 1) from the sampler's RNG.
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  // next() picked from host logits by cpu::sample.
  int sample(const float* logits, int vocab, const std::vector<int>& seen);
  // Whether every pick is the first maximum of the logits (temperature 0, no penalties, no
  // constraint).
  bool greedy() const { return p_.temperature == 0.f && !penalizes() && !constraint_; }
  // Constrained decoding: each pick asks `allowed` for its mask (PickInputs::allowed) when it is
  // made, after the tokens before it were taken.
  void constrain(std::function<const uint8_t*()> allowed) { constraint_ = std::move(allowed); }

 private:
  bool penalizes() const;

  SamplingParams p_;
  SampleArgs args_;
  std::mt19937_64 rng_;
  std::function<const uint8_t*()> constraint_;
  cpu::SampleScratch scratch_;
};

}  // namespace ms
