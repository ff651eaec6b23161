#pragma once
// The CPU's token pick: the reference cuda::sample is tested against.
#include <cstdint>
#include <vector>

#include "kernels/sampling.h"

namespace ms::cpu {

// Reused between picks so that a pick does not allocate.
struct SampleScratch {
  std::vector<float> work;
  std::vector<int> order, order_tmp;
  std::vector<uint32_t> keys, keys_tmp;
  std::vector<double> probs;
};

// The token picked from logits [vocab] (not modified): penalties on in.tokens, then the first
// maximum (temperature 0) or a draw of in.r over the softmax at the temperature, cut by top-k,
// min-p and top-p in turn, candidates ordered by logit (ties: lower id first).
int sample(const float* logits, int vocab, const PickInputs& in, SampleScratch& scratch);

// What sample() draws from (in.r unused): candidate ids and their probabilities, summing to 1;
// at temperature 0 the first maximum alone, with probability 1. Speculative sampling compares
// the target's and the draft's.
struct Distribution {
  std::vector<int> ids;
  std::vector<double> probs;
  double p(int id) const;  // 0 for an id that is not a candidate
};
void distribution(const float* logits, int vocab, const PickInputs& in, SampleScratch& scratch, Distribution& out);

}  // namespace ms::cpu
