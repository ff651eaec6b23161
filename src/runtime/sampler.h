#pragma once
// Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, a seeded RNG.
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#if MOESTREAM_CUDA
#include "kernels/cuda/ops.h"
#endif

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
  // `seen` holds the tokens the penalties look at (prompt and generated so far).
  int sample(const float* logits, int vocab, const std::vector<int>& seen);
#if MOESTREAM_CUDA
  // sample() on logits in device memory (cuda::sample): the same RNG draws, so the same tokens
  // but for cuda::sample's rounding caveat.
  int sample_on_device(const float* device_logits, int vocab, const std::vector<int>& seen, cuda::SamplerWorkspace& ws);
#endif
  // sample() on logits where the forward left them (ForwardOptions::sample): in device memory
  // when on_device, through a workspace this sampler keeps.
  int sample_at(const float* logits, int vocab, const std::vector<int>& seen, bool on_device);
  // Whether every pick is the first maximum of the logits (temperature 0, no penalties): what
  // Model::decode_ahead picks on the GPU.
  bool greedy() const { return p_.temperature == 0.f && !penalizes(); }

 private:
  bool penalizes() const;
#if MOESTREAM_CUDA
  std::shared_ptr<cuda::SamplerWorkspace> ws_;
#endif

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int> order_;
};

}  // namespace ms
