#include "experts/route_synth.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "format/safetensors.h"
#include "util/error.h"

namespace ms {

namespace {

// One layer's tokens: popularity by rank (shuffled over the experts), each token keeping the
// token before's experts with probability p.keep, the rest drawn by popularity.
std::vector<std::vector<int>> synth_layer(const RouteSynth& p, std::mt19937_64& rng) {
  std::vector<int> expert_of_rank(size_t(p.experts));
  std::iota(expert_of_rank.begin(), expert_of_rank.end(), 0);
  std::shuffle(expert_of_rank.begin(), expert_of_rank.end(), rng);
  std::vector<double> weight(size_t(p.experts));
  for (int r = 0; r < p.experts; ++r) weight[size_t(r)] = std::pow(double(r + 1), -p.skew);
  std::discrete_distribution<int> by_popularity(weight.begin(), weight.end());
  std::uniform_int_distribution<int> any(0, p.experts - 1);
  std::bernoulli_distribution kept(p.keep);
  std::vector<char> chosen(size_t(p.experts));
  std::vector<std::vector<int>> tokens;
  std::vector<int> before;
  for (int t = 0; t < p.tokens; ++t) {
    std::vector<int> now;
    for (int e : before)
      if (kept(rng)) now.push_back(e), chosen[size_t(e)] = 1;
    // By popularity without repeats; after many draws that repeat, any expert not yet chosen.
    for (int tries = 0; int(now.size()) < p.top_k;) {
      const int e = ++tries <= 64 * p.top_k ? expert_of_rank[size_t(by_popularity(rng))] : any(rng);
      if (!chosen[size_t(e)]) now.push_back(e), chosen[size_t(e)] = 1;
    }
    for (int e : now) chosen[size_t(e)] = 0;
    tokens.push_back(now);
    before = std::move(now);
  }
  return tokens;
}

double distance(const RoutingCurve& c, const RouteTargets& t) {
  const double a = c.hit[1] - t.hit8, b = c.hit[2] - t.hit4, r = c.reuse - t.reuse;
  return a * a + b * b + r * r;
}

}  // namespace

RouteTraces synth_routes(const RouteSynth& p) {
  if (p.layers < 1 || p.experts < 2 || p.top_k < 1 || p.top_k >= p.experts || p.tokens < 1)
    fail("synth_routes: {} layers, {} experts, top-{}, {} tokens", p.layers, p.experts, p.top_k, p.tokens);
  if (!(p.skew >= 0) || !(p.keep >= 0 && p.keep <= 1)) fail("synth_routes: skew {} and keep {}", p.skew, p.keep);
  std::mt19937_64 rng(p.seed);
  RouteTraces t;
  t.n_layers = p.layers, t.top_k = p.top_k, t.n_experts = p.experts;
  auto& doc = t.routes.emplace_back();
  for (int l = 0; l < p.layers; ++l) doc.push_back(synth_layer(p, rng));
  return t;
}

RouteSynth calibrate_routes(RouteSynth p, const RouteTargets& target) {
  RouteSynth trial = p;
  trial.layers = 1;
  double best = INFINITY;
  auto search = [&](int tokens, double skew0, double keep0, double step, int n_skew, int n_keep) {
    trial.tokens = tokens;
    best = INFINITY;  // each pass judged on its own traces
    for (int i = 0; i < n_skew; ++i)
      for (int j = 0; j < n_keep; ++j) {
        trial.skew = std::max(0.0, skew0 + step * i), trial.keep = std::clamp(keep0 + step * j, 0.0, 1.0);
        const double d = distance(routing_curve(synth_routes(trial)), target);
        if (d < best) best = d, p.skew = trial.skew, p.keep = trial.keep;
      }
  };
  search(1024, 0.0, 0.0, 0.1, 21, 10);                  // skew 0..2, keep 0..0.9
  search(2048, p.skew - 0.1, p.keep - 0.1, 0.025, 9, 9);  // ±0.1 around the best
  return p;
}

void write_route_traces(const std::string& path, const RouteTraces& t) {
  std::vector<TensorData> tensors;
  for (size_t d = 0; d < t.routes.size(); ++d) {
    const auto& doc = t.routes[d];
    const size_t T = doc.empty() ? 0 : doc[0].size();
    TensorData td{"doc" + std::to_string(d) + ".routes", DType::I16,
                  {int64_t(doc.size()), int64_t(T), int64_t(t.top_k)}, {}};
    td.bytes.reserve(doc.size() * T * size_t(t.top_k) * 2);
    for (const auto& layer : doc)
      for (const auto& token : layer)
        for (int e : token) {
          if (e < 0 || e > INT16_MAX) fail("{}: expert id {} does not fit the trace's int16", path, e);
          const auto v = uint16_t(int16_t(e));
          td.bytes.push_back(uint8_t(v & 0xff)), td.bytes.push_back(uint8_t(v >> 8));
        }
    tensors.push_back(std::move(td));
  }
  write_safetensors(path, tensors);
}

}  // namespace ms
