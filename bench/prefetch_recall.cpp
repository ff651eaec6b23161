// How well cross-layer prediction (model/predict.h) recovers misses on a model with trained
// routing: pycoder-moe teacher-forced over the held-out documents of routes.safetensors, one
// token a forward (as decode runs), each document from a cold pool. For every pool size, ahead
// and width asked for: the pool's misses, the prefetcher's recall (misses avoided / misses
// without prefetch) and waste (prefetch reads that avoided no miss / prefetch reads).
//
//   build/bench/bench_prefetch_recall [--model DIR] [--routes FILE] [--tokens N] [--docs N]
//                                     [--slots 16,32] [--ahead 1,2] [--widths 8,12,16]
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/load.h"
#include "format/safetensors.h"
#include "util/error.h"

namespace {

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(std::stoi(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

struct Totals {
  ms::PrefetchStats prefetch;
  ms::PoolStats pool;
};

// One document through a fresh model (a cold pool), a token a forward; its pool and prefetch totals.
Totals run_document(const std::string& dir, const ms::ModelOptions& opt, const int32_t* tokens, int n) {
  auto model = ms::load_model(dir, opt);
  ms::State state = model->new_state();
  for (int t = 0; t < n; ++t) {
    const int id = tokens[t];
    model->forward(&id, 1, state, {.logits = false});
  }
  Totals r;
  for (const ms::LayerStats& l : model->experts()->stats()) {
    r.prefetch += l.prefetch;
    r.pool += l.pool;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  std::string routes = std::string(MOESTREAM_SOURCE_DIR) + "/../shared/models/pycoder-moe/routes.safetensors";
  int tokens = 256, docs = 24;
  std::vector<int> slots{16, 32}, aheads{1, 2}, widths{8, 10, 12, 14, 16};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") dir = v;
    else if (k == "--routes") routes = v;
    else if (k == "--tokens") tokens = std::stoi(v);
    else if (k == "--docs") docs = std::stoi(v);
    else if (k == "--slots") slots = parse_list(v);
    else if (k == "--ahead") aheads = parse_list(v);
    else if (k == "--widths") widths = parse_list(v);
    else ms::fail("unknown option {}", k);
  }
  const ms::TensorStore traces = ms::TensorStore::open(routes);
  std::vector<const ms::TensorView*> documents;
  for (int d = 0; d < docs && traces.has(fmt::format("doc{}.tokens", d)); ++d)
    documents.push_back(&traces.get(fmt::format("doc{}.tokens", d)));
  fmt::print("prefetch recall: {} teacher-forced over {} documents, first {} tokens each, cold pool per document\n", dir,
             documents.size(), tokens);
  fmt::print("{:>5} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}\n", "slots", "ahead", "width", "misses", "read_ahead",
             "used", "wasted", "recall", "waste");
  for (int s : slots)
    for (int a : aheads)
      for (int w : widths) {
        ms::ModelOptions opt;
        opt.experts.slots = s;
        opt.experts.prefetch = {.mode = ms::PrefetchMode::On, .ahead = a, .ahead_early = a, .width = w};
        Totals all;
        for (const ms::TensorView* doc : documents) {
          const int n = std::min<int>(tokens, int(doc->shape[0]));
          const Totals t = run_document(dir, opt, doc->as<int32_t>(), n);
          all.prefetch += t.prefetch;
          all.pool += t.pool;
        }
        const ms::PrefetchSummary sum = ms::summarize(all.prefetch, all.pool.misses);
        fmt::print("{:>5} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>8.3f} {:>8.3f}\n", s, a, w, all.pool.misses,
                   all.prefetch.issued, all.prefetch.used, all.prefetch.wasted, sum.recall, sum.waste);
        std::fflush(stdout);
      }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_prefetch_recall: %s\n", e.what());
  return 1;
}
