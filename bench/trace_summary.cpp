#include "bench/trace_summary.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

#include "util/error.h"

namespace ms::trace {
namespace {

template <class T>
T median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? T{} : v[v.size() / 2];
}

double us(uint64_t ns) { return double(ns) / 1000.0; }
double us_signed(int64_t ns) { return double(ns) / 1000.0; }

struct Replay {
  uint64_t start = UINT64_MAX, end = 0;
  std::vector<const Record*> records;
  std::set<uint64_t> nodes;
};

std::string label(const Record& r) {
  if (r.kind == 'K') return short_name(r.name);
  if (r.kind == 'A') return r.name;
  return fmt::format("{} {} {} B", r.kind == 'C' ? "copy" : "memset", r.name, r.bytes);
}

// The host's calls that overlap [from, to), by name: count and time within it, in order of first
// call (a call that waits for the GPU, begun while the replay ran, counts from the replay's end).
void host_calls(const std::vector<Record>& records, uint64_t from, uint64_t to, FILE* out) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<int, uint64_t>> calls;
  for (const Record& r : records)
    if (r.kind == 'A' && r.end > from && r.start < to) {
      auto [it, fresh] = calls.try_emplace(r.name);
      if (fresh) order.push_back(r.name);
      ++it->second.first, it->second.second += std::min(r.end, to) - std::max(r.start, from);
    }
  for (const std::string& name : order)
    fmt::print(out, "  host between replays: {} x{}, {:.2f} us of the gap\n", name, calls[name].first,
               us(calls[name].second));
}

// Time covered by at least one of the records, in [from, to).
uint64_t busy(std::vector<const Record*> rs, uint64_t from, uint64_t to) {
  std::sort(rs.begin(), rs.end(), [](const Record* a, const Record* b) { return a->start < b->start; });
  uint64_t covered = 0, reach = from;
  for (const Record* r : rs) {
    const uint64_t s = std::max(r->start, reach), e = std::min(r->end, to);
    if (e > s) covered += e - s;
    reach = std::max(reach, std::min(r->end, to));
  }
  return covered;
}

void by_kernel(const std::map<std::string, std::pair<int, uint64_t>>& totals, uint64_t whole, FILE* out) {
  std::vector<std::pair<std::string, std::pair<int, uint64_t>>> rows(totals.begin(), totals.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  fmt::print(out, "  {:>5} {:>10} {:>6}  kernel (time summed, overlaps counted twice)\n", "count", "us", "share");
  for (const auto& [name, ct] : rows)
    fmt::print(out, "  {:>5} {:>10.2f} {:>5.1f}%  {}\n", ct.first, us(ct.second),
               100.0 * double(ct.second) / double(whole), name);
}

void summarize_kernels(const std::vector<Record>& records, FILE* out) {
  std::map<std::string, std::pair<int, uint64_t>> totals;
  uint64_t all = 0;
  size_t gpu = 0;
  for (const Record& r : records) {
    if (r.kind == 'A') continue;
    auto& t = totals[label(r)];
    ++t.first, t.second += r.end - r.start, all += r.end - r.start, ++gpu;
  }
  fmt::print(out, "no graph replayed three times: {} GPU records, {:.1f} us of GPU work\n", gpu, us(all));
  by_kernel(totals, std::max<uint64_t>(all, 1), out);
}

}  // namespace

void write_tsv(const std::vector<Record>& records, FILE* f) {
  for (const Record& r : records)
    fmt::print(f, "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n", r.kind, r.start, r.end, r.stream, r.graph, r.node,
               r.correlation, r.grid, r.block, r.bytes, r.name);
}

std::vector<Record> read_tsv(FILE* f, const std::string& what) {
  std::vector<Record> out;
  char line[1 << 14];
  for (int n = 1; std::fgets(line, sizeof line, f); ++n) {
    Record r;
    char kind = 0;
    unsigned long long start, end, node, bytes;
    unsigned stream, graph, corr;
    int grid, block, used = 0;
    if (std::sscanf(line, "%c\t%llu\t%llu\t%u\t%u\t%llu\t%u\t%d\t%d\t%llu\t%n", &kind, &start, &end, &stream, &graph,
                    &node, &corr, &grid, &block, &bytes, &used) != 10 ||
        used == 0 || (kind != 'K' && kind != 'C' && kind != 'S' && kind != 'A') || end < start)
      fail("{}: line {} is not a trace record (kind, start, end, stream, graph, node, correlation, grid, block, "
           "bytes, name, tab-separated)",
           what, n);
    std::string name(line + used);
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    r.kind = kind, r.start = start, r.end = end, r.stream = stream, r.graph = graph, r.node = node;
    r.correlation = corr, r.grid = grid, r.block = block, r.bytes = bytes, r.name = std::move(name);
    out.push_back(std::move(r));
  }
  return out;
}

std::string short_name(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  for (const std::string drop : {"(anonymous namespace)::", "ms::cuda::"})
    for (size_t at; (at = s.find(drop)) != std::string::npos;) s.erase(at, drop.size());
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) return s.substr(0, i);
  }
  return s;
}

void summarize(std::vector<Record> records, FILE* out) {
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) { return a.start < b.start; });
  // A graph's replays run one after another: a replay ends where one of its nodes comes again.
  std::map<uint32_t, std::vector<Replay>> replays;  // by graph
  for (const Record& r : records) {
    if (r.graph == 0) continue;
    std::vector<Replay>& v = replays[r.graph];
    if (v.empty() || v.back().nodes.count(r.node)) v.emplace_back();
    Replay& p = v.back();
    p.start = std::min(p.start, r.start), p.end = std::max(p.end, r.end);
    p.records.push_back(&r);
    p.nodes.insert(r.node);
  }
  uint32_t graph = 0;
  size_t most = 0;
  for (const auto& [g, v] : replays)
    if (v.size() > most) graph = g, most = v.size();
  if (most < 3) return summarize_kernels(records, out);

  // The first replay may carry the graph's upload: the rest are the steady state.
  std::vector<const Replay*> steps;
  for (const Replay& p : replays[graph]) steps.push_back(&p);
  steps.erase(steps.begin());

  std::vector<uint64_t> spans, gaps;
  for (size_t i = 0; i < steps.size(); ++i) {
    spans.push_back(steps[i]->end - steps[i]->start);
    if (i + 1 < steps.size()) gaps.push_back(steps[i + 1]->start - steps[i]->end);
  }
  const uint64_t span = median(spans), gap = median(gaps);
  const Replay* typical = steps[0];
  for (const Replay* p : steps)
    if (p->end - p->start == span) typical = p;
  fmt::print(out,
             "graph {}: {} replays of {} nodes; median span {:.1f} us, GPU busy {:.1f} us of it; median gap to "
             "the next replay {:.1f} us ({:.1f} % of a step)\n",
             graph, steps.size() + 1, typical->records.size(), us(span),
             us(busy(typical->records, typical->start, typical->end)), us(gap),
             100.0 * double(gap) / double(std::max<uint64_t>(span + gap, 1)));

  // What ran between the typical replay and the next: the host's part of a step.
  const auto next = std::find(steps.begin(), steps.end(), typical) + 1;
  if (next != steps.end()) {
    const uint64_t from = typical->end, to = (*next)->start;
    for (const Record& r : records)
      if (r.kind != 'A' && r.graph == 0 && r.start >= from && r.start < to)
        fmt::print(out, "  between replays: +{:.2f} us {:.2f} us  {}\n", us(r.start - from), us(r.end - r.start),
                   label(r));
    host_calls(records, from, to, out);
    const Record* launch = nullptr;  // the call that launched the next replay: the last launch before it
    for (const Record& r : records)
      if (r.kind == 'A' && r.name.rfind("cudaGraphLaunch", 0) == 0 && r.start < to) launch = &r;
    if (launch && launch->start >= from)
      fmt::print(out,
                 "  the next replay's launch began +{:.2f} us, took {:.2f} us; its first node began {:.2f} us "
                 "after the call did\n",
                 us(launch->start - from), us(launch->end - launch->start), us(to - launch->start));
  }

  struct Node {
    std::vector<int64_t> starts;
    std::vector<uint64_t> durations;
    const Record* first = nullptr;
  };
  std::map<uint64_t, Node> nodes;
  for (const Replay* p : steps)
    for (const Record* r : p->records) {
      Node& n = nodes[r->node];
      if (!n.first) n.first = r;
      n.starts.push_back(int64_t(r->start - p->start));
      n.durations.push_back(r->end - r->start);
    }
  struct Row {
    int64_t start;
    uint64_t duration;
    const Record* r;
  };
  std::vector<Row> rows;
  for (const auto& [id, n] : nodes) rows.push_back({median(n.starts), median(n.durations), n.first});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.start < b.start; });
  fmt::print(out, "  {:>9} {:>8} {:>9} {:>6} {:>5} {:>6}  node (medians over replays; after: start less the latest "
                  "end before it, negative where it overlaps)\n",
             "start us", "us", "after us", "grid", "block", "stream");
  int64_t reach = 0;
  std::map<std::string, std::pair<int, uint64_t>> totals;
  for (const Row& row : rows) {
    fmt::print(out, "  {:>9.2f} {:>8.2f} {:>9.2f} {:>6} {:>5} {:>6}  {}\n", us_signed(row.start), us(row.duration),
               us_signed(row.start - reach), row.r->grid, row.r->block, row.r->stream, label(*row.r));
    reach = std::max(reach, row.start + int64_t(row.duration));
    auto& t = totals[label(*row.r)];
    ++t.first, t.second += row.duration;
  }
  by_kernel(totals, std::max<uint64_t>(span, 1), out);
}

}  // namespace ms::trace
