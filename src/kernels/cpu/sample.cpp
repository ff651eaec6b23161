#include "kernels/cpu/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ms::cpu {

namespace {

void penalize(std::vector<float>& logits, const PickInputs& in) {
  const SampleArgs& a = in.args;
  for (size_t i = 0; i < in.tokens.size(); ++i) {
    float& l = logits[size_t(in.tokens[i])];
    if (a.repetition_penalty != 1.f) l = l > 0 ? l / a.repetition_penalty : l * a.repetition_penalty;
    l -= a.presence_penalty + a.frequency_penalty * float(in.counts[i]);
  }
}

// How many of the candidates (probabilities in descending order) min-p and top-p keep, at least one.
size_t kept(const std::vector<double>& probs, const SampleArgs& a) {
  size_t keep = probs.size();
  if (a.min_p > 0.f)  // drop tokens less likely than min_p times the most likely one
    keep = size_t(std::find_if(probs.begin(), probs.end(), [&](double q) { return q < a.min_p * probs[0]; }) - probs.begin());
  if (a.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double mass = 0;
    for (size_t i = 0; i < keep; ++i)
      if ((mass += probs[i]) >= a.top_p) {
        keep = i + 1;
        break;
      }
  }
  return std::max<size_t>(1, keep);
}

}  // namespace

int sample(const float* logits, int vocab, const PickInputs& in, SampleScratch& s) {
  const SampleArgs& a = in.args;
  std::vector<float>& work = s.work;
  work.assign(logits, logits + vocab);
  penalize(work, in);
  if (a.temperature == 0.f) return int(std::max_element(work.begin(), work.end()) - work.begin());

  // Candidates by descending logit; top-k cuts the list before the softmax.
  std::vector<int>& order = s.order;
  order.resize(size_t(vocab));
  std::iota(order.begin(), order.end(), 0);
  const size_t k = a.top_k > 0 ? std::min<size_t>(size_t(a.top_k), size_t(vocab)) : size_t(vocab);
  auto by_logit = [&work](int x, int y) { return work[size_t(x)] > work[size_t(y)] || (work[size_t(x)] == work[size_t(y)] && x < y); };
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), by_logit);
  order.resize(k);

  std::vector<double>& probs = s.probs;
  probs.resize(k);
  const double mx = work[size_t(order[0])];
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += probs[i] = std::exp((work[size_t(order[i])] - mx) / a.temperature);
  for (auto& q : probs) q /= sum;

  const size_t keep = kept(probs, a);
  const double total = std::accumulate(probs.begin(), probs.begin() + std::ptrdiff_t(keep), 0.0);
  // uniform_real_distribution(0, total) draws generate_canonical * total: in.r * total.
  double u = in.r * total;
  for (size_t i = 0; i < keep; ++i)
    if ((u -= probs[i]) < 0) return order[i];
  return order[keep - 1];
}

}  // namespace ms::cpu
