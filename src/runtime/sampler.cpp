#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "util/error.h"

namespace ms {

void SamplingParams::validate() const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature)) fail("temperature must be >= 0, is {}", temperature);
  if (top_k < 0) fail("top_k must be >= 0, is {}", top_k);
  if (!(top_p > 0.f && top_p <= 1.f)) fail("top_p must be in (0, 1], is {}", top_p);
  if (!(min_p >= 0.f && min_p <= 1.f)) fail("min_p must be in [0, 1], is {}", min_p);
  if (!(repetition_penalty > 0.f)) fail("repetition_penalty must be > 0, is {}", repetition_penalty);
  if (!std::isfinite(presence_penalty)) fail("presence_penalty must be a finite number");
  if (!std::isfinite(frequency_penalty)) fail("frequency_penalty must be a finite number");
}

namespace {

// How often each token of the vocabulary occurs in `seen`.
std::unordered_map<int, int> count_seen(const std::vector<int>& seen, int vocab) {
  std::unordered_map<int, int> counts;
  for (int t : seen)
    if (t >= 0 && t < vocab) ++counts[t];
  return counts;
}

}  // namespace

Sampler::Sampler(const SamplingParams& p)
    : p_(p),
      args_{p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty},
      rng_(p.seed) {
  p_.validate();
}

bool Sampler::penalizes() const {
  return p_.repetition_penalty != 1.f || p_.presence_penalty != 0.f || p_.frequency_penalty != 0.f;
}

PickInputs Sampler::inputs(const std::vector<int>& seen, int vocab) const {
  PickInputs in{.args = args_};
  if (penalizes())
    for (auto [t, n] : count_seen(seen, vocab)) {
      in.tokens.push_back(t);
      in.counts.push_back(n);
    }
  return in;
}

PickInputs Sampler::next(const std::vector<int>& seen, int vocab) {
  PickInputs in = inputs(seen, vocab);
  // The one draw a pick takes, as uniform_real_distribution(0, total) would (cpu::sample scales it).
  if (p_.temperature > 0.f) in.r = uniform();
  if (constraint_) in.allowed = constraint_();
  return in;
}

int Sampler::sample(const float* logits, int vocab, const std::vector<int>& seen) {
  return cpu::sample(logits, vocab, next(seen, vocab), scratch_);
}

}  // namespace ms
