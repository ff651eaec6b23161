#pragma once
// Predictive expert streaming's knobs and parts that know nothing of the model: which layer
// predicts which (the schedule), how many experts a prediction names (the width, adapted to
// what the disk has to spare), the staging buffers prefetch reads land in, and the counters
// --stats reports. The prediction itself (a later layer's router on this layer's output) is
// model/predict.h; ExpertStore issues the reads and promotes staged experts.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "experts/io_engine.h"
#include "util/memory.h"

namespace ms {

enum class PrefetchMode { Off, On, Auto };  // Auto: on where a pool streams (holds fewer than all)

struct PrefetchOptions {
  PrefetchMode mode = PrefetchMode::Auto;
  // Layer L's experts are predicted from the residual stream after layer L - a: a = ahead_early
  // for L below `cutoff`, else ahead (the seed's ahead_hi / ahead_lo / cutoff).
  int ahead = 1, ahead_early = 1, cutoff = 0;
  int width = 0;    // experts a prediction names; 0 = adaptive, starting at top_k
  int staging = 0;  // staging buffers; 0 = 2 x the widest width x the largest ahead
  int max_ahead() const { return ahead > ahead_early ? ahead : ahead_early; }
  int ahead_of(int layer) const { return layer < cutoff ? ahead_early : ahead; }
};

PrefetchMode parse_prefetch_mode(const std::string& s);  // off | on | auto
// "A" or "E,A@C": a = E below layer C, A from it. Fails naming the text.
void parse_prefetch_ahead(const std::string& s, PrefetchOptions& o);
// "auto" or a width N >= 1.
int parse_prefetch_width(const std::string& s);

// The widths an adaptive prefetcher moves between for a model routing top_k experts a token.
int min_prefetch_width(int top_k);
int max_prefetch_width(int top_k);
// Staging buffers `o` asks for (its own, or the default for a model of top_k).
int staging_buffers(const PrefetchOptions& o, int top_k);

struct PrefetchStats {
  uint64_t predicted = 0;  // experts the predictions named
  uint64_t issued = 0;     // of them, read into staging (neither resident nor staged already)
  uint64_t used = 0;       // staged experts that routing asked for: misses served without a demand read
  uint64_t wasted = 0;     // staged experts dropped without use
  uint64_t no_buffer = 0;  // named but not read: every staging buffer was in flight or in use
  uint64_t bytes = 0;      // read by prefetch
  // Named, not copied into VRAM: the hybrid decode's CPU is to compute them (read from disk into
  // host memory where missing, their copies' PCIe time left to the experts the GPU computes).
  uint64_t for_cpu = 0;
  PrefetchStats& operator+=(const PrefetchStats& o);
};

// What the counters say of a prediction's worth, given the pool's misses (each of which, without
// prefetch, would have been a demand read: promotion leaves the pool's own state as it was).
struct PrefetchSummary {
  double recall = 0;  // misses avoided / misses without prefetch
  double waste = 0;   // prefetch reads that avoided no miss / prefetch reads
  uint64_t demand_misses = 0;  // misses left to demand reads
};
PrefetchSummary summarize(const PrefetchStats& p, uint64_t pool_misses);

// The width W, adapted once a window (about a token's predictions): it narrows while demand
// reads share the disk with prefetch reads that are mostly wasted, and widens while the disk
// has room (no demand read waited behind a prefetch) and demand misses are left to avoid.
class WidthController {
 public:
  WidthController(int start, int lo, int hi) : w_(start), lo_(lo), hi_(hi) {}
  int width() const { return w_; }
  // One window's counts: prefetch reads issued, staged experts used, demand misses left, and
  // demand reads that were submitted while prefetch reads were in flight.
  void update(uint64_t issued, uint64_t used, uint64_t demand_misses, uint64_t demand_behind_prefetch);
  // update() from a store's running totals: its prefetch counters and the demand reads queued
  // behind prefetch so far (the window's deltas taken here), and the demand misses since the last
  // window. The next window starts at these totals.
  void update_from_totals(const PrefetchStats& total, uint64_t window_misses, uint64_t behind_total);
  // The store's statistics were reset: the next window starts from zero counters and `behind_total`.
  void restart_window(uint64_t behind_total) {
    start_ = {};
    behind_start_ = behind_total;
  }
  double mean() const { return windows_ ? sum_ / double(windows_) : double(w_); }

 private:
  PrefetchStats start_;
  uint64_t behind_start_ = 0;
  int w_, lo_, hi_;
  double sum_ = 0;
  uint64_t windows_ = 0;
};

// The width controller `o` asks for: fixed at o.width, or adaptive from top_k between
// min_prefetch_width and max_prefetch_width.
std::unique_ptr<WidthController> make_width_controller(const PrefetchOptions& o, int top_k);

// Where prefetch reads land: a fixed set of buffers, each holding the record of one predicted
// (layer, expert) that is not resident. Routing that asks for a staged expert claims it
// (ExpertStore copies it into a pool slot); one never asked for is dropped, oldest first, when
// its buffer is needed. Not thread-safe: ExpertStore locks around it.
class Staging {
 public:
  struct Entry {
    int layer = -1, expert = -1;  // layer -1: free
    AsyncRead read;
    bool claimed = false;  // an acquire is promoting it: not to be dropped
    uint64_t stamp = 0;    // when it was staged
    uint8_t* data = nullptr;  // buffer_bytes(); a promotion may exchange it for a pool slot's
  };

  Staging(int buffers, size_t buffer_bytes);
  int buffers() const { return int(entries_.size()); }
  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t bytes() const { return memory_.bytes(); }
  // The memory every buffer lies in, an entry's or (exchanged for a staged record) a pool slot's.
  uint8_t* memory() const { return memory_.data(); }

  Entry* find(int layer, int expert);
  // A buffer for a new read of (layer, expert): a free one, else the oldest unclaimed one whose
  // read is done, its expert dropped (*dropped_layer: its layer, for the caller to count it
  // wasted; -1 where the buffer was free); null when every buffer is in flight or claimed.
  // The entry is marked not done, so that no one uses it before its read is submitted.
  Entry* take(int layer, int expert, int* dropped_layer);
  void free(Entry* e);
  // Every entry, for waiting on reads in flight before the memory goes.
  const std::vector<std::unique_ptr<Entry>>& entries() const { return entries_; }

 private:
  ResidentMemory memory_;
  size_t buffer_bytes_;
  std::vector<std::unique_ptr<Entry>> entries_;
  uint64_t clock_ = 0;
};

}  // namespace ms
