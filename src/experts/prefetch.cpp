#include "experts/prefetch.h"

#include <algorithm>
#include <cstdio>

#include "util/error.h"

namespace ms {

PrefetchMode parse_prefetch_mode(const std::string& s) {
  if (s == "off") return PrefetchMode::Off;
  if (s == "on") return PrefetchMode::On;
  if (s == "auto") return PrefetchMode::Auto;
  fail("unknown prefetch mode '{}' (expected off, on or auto)", s);
}

namespace {
// s as a whole number in [lo, 4096], or -1.
int whole_number(const std::string& s, int lo) {
  size_t used = 0;
  int v = -1;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
  }
  return used == s.size() && v >= lo && v <= 4096 ? v : -1;
}

int parse_count(const std::string& s, const std::string& whole, const char* what, int lo) {
  const int v = whole_number(s, lo);
  if (v < 0) fail("prefetch ahead '{}': {} '{}' is not a number of at least {}", whole, what, s, lo);
  return v;
}
}  // namespace

void parse_prefetch_ahead(const std::string& s, PrefetchOptions& o) {
  const size_t comma = s.find(','), at = s.find('@');
  if (comma == std::string::npos && at == std::string::npos) {
    o.ahead = o.ahead_early = parse_count(s, s, "the layers ahead", 1);
    o.cutoff = 0;
    return;
  }
  if (comma == std::string::npos || at == std::string::npos || at < comma)
    fail("prefetch ahead '{}' is neither A nor E,A@C (e.g. 2,1@12: two layers ahead below layer 12, one from it)", s);
  o.ahead_early = parse_count(s.substr(0, comma), s, "the early layers' ahead", 1);
  o.ahead = parse_count(s.substr(comma + 1, at - comma - 1), s, "the later layers' ahead", 1);
  o.cutoff = parse_count(s.substr(at + 1), s, "the cutoff layer", 0);
}

int parse_prefetch_width(const std::string& s) {
  if (s == "auto") return 0;
  const int v = whole_number(s, 1);
  if (v < 0) fail("prefetch width '{}' is neither auto nor a number of experts >= 1", s);
  return v;
}

std::unique_ptr<WidthController> make_width_controller(const PrefetchOptions& o, int top_k) {
  if (o.width > 0) return std::make_unique<WidthController>(o.width, o.width, o.width);
  return std::make_unique<WidthController>(top_k, min_prefetch_width(top_k), max_prefetch_width(top_k));
}

int min_prefetch_width(int top_k) { return std::max(1, top_k / 2); }
int max_prefetch_width(int top_k) { return 2 * top_k; }

int staging_buffers(const PrefetchOptions& o, int top_k) {
  if (o.staging > 0) return o.staging;
  const int widest = o.width > 0 ? o.width : max_prefetch_width(top_k);
  return 2 * widest * o.max_ahead();
}

PrefetchStats& PrefetchStats::operator+=(const PrefetchStats& o) {
  predicted += o.predicted;
  issued += o.issued;
  used += o.used;
  wasted += o.wasted;
  for_cpu += o.for_cpu;
  no_buffer += o.no_buffer;
  bytes += o.bytes;
  return *this;
}

PrefetchSummary summarize(const PrefetchStats& p, uint64_t pool_misses) {
  PrefetchSummary s;
  s.recall = pool_misses ? double(p.used) / double(pool_misses) : 0.0;
  s.waste = p.issued ? double(p.issued - std::min(p.used, p.issued)) / double(p.issued) : 0.0;
  s.demand_misses = pool_misses - std::min(p.used, pool_misses);
  return s;
}

void WidthController::update_from_totals(const PrefetchStats& total, uint64_t window_misses, uint64_t behind_total) {
  update(total.issued - start_.issued, total.used - start_.used, window_misses, behind_total - behind_start_);
  start_ = total;
  behind_start_ = behind_total;
}

void WidthController::update(uint64_t issued, uint64_t used, uint64_t demand_misses, uint64_t demand_behind_prefetch) {
  const bool contended = demand_behind_prefetch > 0;
  const bool mostly_wasted = issued > 0 && 2 * used < issued;
  if (contended && mostly_wasted) w_ = std::max(lo_, w_ - 1);
  else if (!contended && demand_misses > 0 && !mostly_wasted) w_ = std::min(hi_, w_ + 1);
  sum_ += w_;
  ++windows_;
}

Staging::Staging(int buffers, size_t buffer_bytes)
    : memory_(size_t(buffers) * buffer_bytes, "the prefetch staging area"), buffer_bytes_(buffer_bytes) {
  for (int i = 0; i < buffers; ++i) {
    entries_.push_back(std::make_unique<Entry>());
    entries_.back()->data = memory_.data() + size_t(i) * buffer_bytes;
    entries_.back()->read.finished.store(true);  // nothing in flight
  }
}

Staging::Entry* Staging::find(int layer, int expert) {
  for (auto& e : entries_)
    if (e->layer == layer && e->expert == expert) return e.get();
  return nullptr;
}

Staging::Entry* Staging::take(int layer, int expert, int* dropped_layer) {
  Entry* best = nullptr;
  for (auto& e : entries_) {
    if (e->layer < 0) {
      best = e.get();
      break;
    }
    if (e->claimed || !e->read.done()) continue;
    if (!best || e->stamp < best->stamp) best = e.get();
  }
  if (!best) return nullptr;
  *dropped_layer = best->layer;
  best->read.finished.store(false, std::memory_order_relaxed);
  best->layer = layer;
  best->expert = expert;
  best->claimed = false;
  best->stamp = ++clock_;
  return best;
}

void Staging::free(Entry* e) {
  e->layer = e->expert = -1;
  e->claimed = false;
}

}  // namespace ms
