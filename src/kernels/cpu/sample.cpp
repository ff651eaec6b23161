#include "kernels/cpu/sample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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

// Every id by descending s.work, ties by ascending id (the order partial_sort with by_logit
// gives) into s.order: four stable byte passes over keys that order as the floats do, O(vocab)
// where a comparison sort of 152k ids costs ~15 ms a token.
void sort_by_logit(SampleScratch& s) {
  const size_t n = s.work.size();
  s.keys.resize(n), s.keys_tmp.resize(n), s.order.resize(n), s.order_tmp.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float f = s.work[i] == 0.f ? 0.f : s.work[i];  // -0 ties with +0, as the comparison has it
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending as the float
    s.keys[i] = ~u, s.order[i] = int(i);              // descending
  }
  for (int shift = 0; shift < 32; shift += 8) {
    size_t at[257] = {};
    for (size_t i = 0; i < n; ++i) ++at[((s.keys[i] >> shift) & 0xffu) + 1];
    for (int b = 0; b < 256; ++b) at[b + 1] += at[b];
    for (size_t i = 0; i < n; ++i) {
      const size_t d = at[(s.keys[i] >> shift) & 0xffu]++;
      s.keys_tmp[d] = s.keys[i], s.order_tmp[d] = s.order[i];
    }
    s.keys.swap(s.keys_tmp), s.order.swap(s.order_tmp);
  }
}

// top-k at or above this many candidates sorts them all (sort_by_logit) rather than partially.
constexpr size_t kRadixFrom = 256;

// The candidates a pick at a temperature above 0 draws from: s.order[0, keep) by descending
// logit, s.probs their softmax probabilities before min-p and top-p's cut (not renormalised);
// returns keep.
size_t candidates(int vocab, const PickInputs& in, SampleScratch& s) {
  const SampleArgs& a = in.args;
  std::vector<float>& work = s.work;
  // Candidates by descending logit; top-k cuts the list before the softmax.
  std::vector<int>& order = s.order;
  const size_t k = a.top_k > 0 ? std::min<size_t>(size_t(a.top_k), size_t(vocab)) : size_t(vocab);
  if (k >= kRadixFrom) {
    sort_by_logit(s);
  } else {
    order.resize(size_t(vocab));
    std::iota(order.begin(), order.end(), 0);
    auto by_logit = [&work](int x, int y) { return work[size_t(x)] > work[size_t(y)] || (work[size_t(x)] == work[size_t(y)] && x < y); };
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), by_logit);
  }
  order.resize(k);

  std::vector<double>& probs = s.probs;
  probs.resize(k);
  const double mx = work[size_t(order[0])];
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += probs[i] = std::exp((work[size_t(order[i])] - mx) / a.temperature);
  for (auto& q : probs) q /= sum;
  return kept(probs, a);
}

// The penalised logits in s.work; the first maximum's id where the temperature is 0, else -1.
int penalised(const float* logits, int vocab, const PickInputs& in, SampleScratch& s) {
  s.work.assign(logits, logits + vocab);
  penalize(s.work, in);
  if (in.allowed)
    for (int i = 0; i < vocab; ++i)
      if (!in.allowed[i]) s.work[size_t(i)] = -std::numeric_limits<float>::infinity();
  if (in.args.temperature == 0.f) return int(std::max_element(s.work.begin(), s.work.end()) - s.work.begin());
  return -1;
}

}  // namespace

int sample(const float* logits, int vocab, const PickInputs& in, SampleScratch& s) {
  if (const int top = penalised(logits, vocab, in, s); top >= 0) return top;
  const size_t keep = candidates(vocab, in, s);
  const std::vector<double>& probs = s.probs;
  const double total = std::accumulate(probs.begin(), probs.begin() + std::ptrdiff_t(keep), 0.0);
  // uniform_real_distribution(0, total) draws generate_canonical * total: in.r * total.
  double u = in.r * total;
  for (size_t i = 0; i < keep; ++i)
    if ((u -= probs[i]) < 0) return s.order[i];
  return s.order[keep - 1];
}

void distribution(const float* logits, int vocab, const PickInputs& in, SampleScratch& s, Distribution& out) {
  out.ids.clear();
  out.probs.clear();
  if (const int top = penalised(logits, vocab, in, s); top >= 0) {
    out.ids.push_back(top);
    out.probs.push_back(1.0);
    return;
  }
  const size_t keep = candidates(vocab, in, s);
  const double total = std::accumulate(s.probs.begin(), s.probs.begin() + std::ptrdiff_t(keep), 0.0);
  for (size_t i = 0; i < keep; ++i) {
    out.ids.push_back(s.order[i]);
    out.probs.push_back(s.probs[i] / total);
  }
}

double Distribution::p(int id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return probs[i];
  return 0.0;
}

}  // namespace ms::cpu
