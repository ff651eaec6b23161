#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { p_.validate(); }

bool Sampler::penalizes() const {
  return p_.repetition_penalty != 1.f || p_.presence_penalty != 0.f || p_.frequency_penalty != 0.f;
}

int Sampler::sample(const float* logits, int vocab, const std::vector<int>& seen) {
  work_.assign(logits, logits + vocab);
  if (penalizes()) {
    for (auto [t, n] : count_seen(seen, vocab)) {
      float& l = work_[size_t(t)];
      if (p_.repetition_penalty != 1.f) l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
      l -= p_.presence_penalty + p_.frequency_penalty * float(n);
    }
  }
  if (p_.temperature == 0.f) return int(std::max_element(work_.begin(), work_.end()) - work_.begin());

  // Candidates by descending logit; top-k cuts the list before the softmax.
  order_.resize(size_t(vocab));
  std::iota(order_.begin(), order_.end(), 0);
  const size_t k = p_.top_k > 0 ? std::min<size_t>(size_t(p_.top_k), size_t(vocab)) : size_t(vocab);
  auto by_logit = [this](int a, int b) { return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b); };
  std::partial_sort(order_.begin(), order_.begin() + std::ptrdiff_t(k), order_.end(), by_logit);
  order_.resize(k);

  std::vector<double> probs(k);
  const double mx = work_[size_t(order_[0])];
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += probs[i] = std::exp((work_[size_t(order_[i])] - mx) / p_.temperature);
  for (auto& q : probs) q /= sum;

  size_t keep = k;
  if (p_.min_p > 0.f)  // drop tokens less likely than min_p times the most likely one
    keep = size_t(std::find_if(probs.begin(), probs.end(), [&](double q) { return q < p_.min_p * probs[0]; }) - probs.begin());
  if (p_.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double mass = 0;
    for (size_t i = 0; i < keep; ++i)
      if ((mass += probs[i]) >= p_.top_p) {
        keep = i + 1;
        break;
      }
  }
  keep = std::max<size_t>(1, keep);
  const double total = std::accumulate(probs.begin(), probs.begin() + std::ptrdiff_t(keep), 0.0);
  double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < keep; ++i)
    if ((u -= probs[i]) < 0) return order_[i];
  return order_[keep - 1];
}

int Sampler::sample_at(const float* logits, int vocab, const std::vector<int>& seen, bool on_device) {
  if (!on_device) return sample(logits, vocab, seen);
#if MOESTREAM_CUDA
  if (!ws_) ws_ = std::make_shared<cuda::SamplerWorkspace>();
  return sample_on_device(logits, vocab, seen, *ws_);
#else
  fail("logits in device memory, and this build has no CUDA backend");
#endif
}

#if MOESTREAM_CUDA
int Sampler::sample_on_device(const float* device_logits, int vocab, const std::vector<int>& seen,
                              cuda::SamplerWorkspace& ws) {
  std::vector<int> staged;  // the distinct seen tokens, then their counts
  if (penalizes()) {
    const auto counts = count_seen(seen, vocab);
    for (auto [t, n] : counts) staged.push_back(t);
    for (auto [t, n] : counts) staged.push_back(n);
  }
  const int n = int(staged.size() / 2);
  const size_t bytes = staged.size() * sizeof(int);
  if (ws.staging.size() < bytes) ws.staging = cuda::DeviceBuffer(bytes);
  if (bytes) ws.staging.upload(staged.data(), bytes);
  // uniform_real_distribution(0, total) is generate_canonical * total: the CPU's draw is r * total.
  const double r = p_.temperature > 0.f ? std::uniform_real_distribution<double>(0.0, 1.0)(rng_) : 0.0;
  const cuda::SampleArgs args{p_.temperature,    p_.top_k,           p_.top_p,          p_.min_p,
                              p_.repetition_penalty, p_.presence_penalty, p_.frequency_penalty};
  const int* tokens = ws.staging.as<int>();
  return cuda::sample(device_logits, vocab, tokens, tokens + n, n, args, r, ws);
}
#endif

}  // namespace ms
