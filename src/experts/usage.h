#pragma once
// Usage history (--usage): how often each expert of each layer was routed, older runs weighing
// less, kept beside the model (or in the user's state directory where the model's directory is
// read-only) so that a later run can start with the hottest experts resident (--warm-start).
// A file of another model or shape, or a damaged one, is ignored with a warning: it only ever
// changes what is resident, never an answer.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/engine_dir.h"

namespace ms {

// Weight of the history before a run when the run's counts are merged in.
constexpr double kUsageDecay = 0.75;

struct UsageHistory {
  uint64_t model = 0;                       // usage_fingerprint of the index it belongs to
  std::vector<std::string> layers;          // expert layer names, in the index's order
  std::vector<std::vector<double>> counts;  // [layer][expert]: routings
  uint64_t runs = 0;                        // runs merged into it

  bool empty() const;  // no routing counted
  // Multiplies every count by `decay` (older runs weigh less), then adds `run`'s (same model).
  void merge(const UsageHistory& run, double decay = kUsageDecay);
  // At most n of layer l's routed experts, most routed first (ties: lower id first).
  std::vector<int> hottest(size_t l, int n) const;
};

// The identity of an engine directory's experts: its architecture, and every layer's name,
// expert count and record checksums.
uint64_t usage_fingerprint(const EngineIndex& index);
// A history of no routings for index's layers.
UsageHistory empty_usage(const EngineIndex& index);

// Reads `path`: nullopt where it does not exist; nullopt with *warning saying why (naming the
// file) where it cannot be read, is damaged, or belongs to another model or shape.
std::optional<UsageHistory> read_usage(const std::string& path, const EngineIndex& index, std::string* warning);
// Writes h to `path` atomically: a temporary file beside it, flushed to disk, renamed over it.
// Throws naming the file where that fails.
void write_usage(const std::string& path, const UsageHistory& h);

// Where an engine directory's history lives unless --usage names a file: usage.json in the
// directory where it may be written, else usage-<fingerprint>.json in $XDG_STATE_HOME/moestream
// (~/.local/state/moestream).
std::string default_usage_path(const std::string& dir, const EngineIndex& index);

}  // namespace ms
