#include "experts/simulate.h"

#include <algorithm>
#include <limits>

#include "experts/pool.h"
#include "format/safetensors.h"
#include "util/error.h"

namespace ms {

RouteTraces load_route_traces(const std::string& path, int n_experts) {
  TensorStore store = TensorStore::open(path);
  RouteTraces t;
  int max_id = -1;
  for (int d = 0; store.has("doc" + std::to_string(d) + ".routes"); ++d) {
    const TensorView& r = store.get("doc" + std::to_string(d) + ".routes");
    r.expect(DType::I16, {-1, -1, -1});
    const int L = int(r.dim(0)), T = int(r.dim(1)), K = int(r.dim(2));
    if (d == 0) t.n_layers = L, t.top_k = K;
    if (L != t.n_layers || K != t.top_k)
      fail("{}: tensor '{}' has {} layers x top-{}, the first document {} x {}", path, r.name, L, K, t.n_layers, t.top_k);
    auto& doc = t.routes.emplace_back(size_t(L));
    for (int l = 0; l < L; ++l)
      for (int i = 0; i < T; ++i) {
        const int16_t* ids = r.as<int16_t>() + (size_t(l) * size_t(T) + size_t(i)) * size_t(K);
        doc[size_t(l)].emplace_back(ids, ids + K);
        for (int k = 0; k < K; ++k) {
          if (ids[k] < 0) fail("{}: tensor '{}' holds a negative expert id {}", path, r.name, ids[k]);
          max_id = std::max(max_id, int(ids[k]));
        }
      }
  }
  if (t.routes.empty()) fail("{}: no docN.routes tensors", path);
  t.n_experts = n_experts > 0 ? n_experts : max_id + 1;
  if (max_id >= t.n_experts) fail("{}: expert id {} out of range for {} experts", path, max_id, t.n_experts);
  return t;
}

double SimResult::hit_rate(int layer) const {
  return accesses[size_t(layer)] ? double(hits[size_t(layer)]) / double(accesses[size_t(layer)]) : 0.0;
}

double SimResult::total_hit_rate() const {
  uint64_t h = 0, a = 0;
  for (size_t l = 0; l < hits.size(); ++l) h += hits[l], a += accesses[l];
  return a ? double(h) / double(a) : 0.0;
}

namespace {
void check_slots(const RouteTraces& t, int slots) {
  if (slots < t.top_k) fail("{} slots cannot hold one token's {} experts", slots, t.top_k);
}
}  // namespace

SimResult simulate_policy(const RouteTraces& t, int slots, PolicyKind policy) {
  check_slots(t, slots);
  SimResult r{std::vector<uint64_t>(size_t(t.n_layers)), std::vector<uint64_t>(size_t(t.n_layers))};
  for (const auto& doc : t.routes)
    for (int l = 0; l < t.n_layers; ++l) {
      ExpertPool pool(t.n_experts, slots, 0, policy);
      std::vector<ExpertPool::Miss> misses;
      for (const auto& token : doc[size_t(l)]) {
        misses.clear();
        pool.acquire(token, &misses);
        for (auto m : misses) pool.publish(m.expert, m.slot);
        pool.release();
      }
      const PoolStats s = pool.stats();
      r.hits[size_t(l)] += s.hits;
      r.accesses[size_t(l)] += s.hits + s.misses;
    }
  return r;
}

RoutingCurve routing_curve(const RouteTraces& t) {
  RoutingCurve c;
  if (t.routes.empty() || t.n_layers == 0) return c;
  for (int i = 0; i < 4; ++i)
    c.hit[i] = simulate_policy(t, std::max(t.top_k, t.n_experts / kCurveFractions[i]), PolicyKind::LRU).total_hit_rate();
  uint64_t reused = 0, routed = 0;
  std::vector<char> before(size_t(t.n_experts));
  for (const auto& doc : t.routes)
    for (const auto& layer : doc)
      for (size_t s = 1; s < layer.size(); ++s) {
        for (int e : layer[s - 1]) before[size_t(e)] = 1;
        for (int e : layer[s]) reused += uint64_t(before[size_t(e)]), ++routed;
        for (int e : layer[s - 1]) before[size_t(e)] = 0;
      }
  c.reuse = routed ? double(reused) / double(routed) : 0.0;
  return c;
}

SimResult simulate_belady(const RouteTraces& t, int slots) {
  check_slots(t, slots);
  constexpr size_t kNever = std::numeric_limits<size_t>::max();
  SimResult r{std::vector<uint64_t>(size_t(t.n_layers)), std::vector<uint64_t>(size_t(t.n_layers))};
  for (const auto& doc : t.routes)
    for (int l = 0; l < t.n_layers; ++l) {
      const auto& seq = doc[size_t(l)];
      // next_use[i][k]: the next token after i that routes seq[i][k]'s expert.
      std::vector<size_t> next_seen(size_t(t.n_experts), kNever);
      std::vector<std::vector<size_t>> next_use(seq.size());
      for (size_t i = seq.size(); i-- > 0;) {
        for (int e : seq[i]) next_use[i].push_back(next_seen[size_t(e)]);
        for (int e : seq[i]) next_seen[size_t(e)] = i;
      }
      std::vector<size_t> resident_next(size_t(t.n_experts), kNever);  // next use of each resident expert
      std::vector<char> resident(size_t(t.n_experts), 0);
      int count = 0;
      for (size_t i = 0; i < seq.size(); ++i) {
        const auto& token = seq[i];
        for (int e : token) {
          ++r.accesses[size_t(l)];
          if (resident[size_t(e)]) {
            ++r.hits[size_t(l)];
            continue;
          }
          if (count == slots) {  // evict the resident expert used farthest in the future
            int victim = -1;
            for (int x = 0; x < t.n_experts; ++x) {
              if (!resident[size_t(x)] || std::find(token.begin(), token.end(), x) != token.end()) continue;
              if (victim < 0 || resident_next[size_t(x)] > resident_next[size_t(victim)]) victim = x;
            }
            resident[size_t(victim)] = 0;
            --count;
          }
          resident[size_t(e)] = 1;
          ++count;
        }
        for (size_t k = 0; k < token.size(); ++k) resident_next[size_t(token[k])] = next_use[i][k];
      }
    }
  return r;
}

}  // namespace ms
