#pragma once
// Usage history (--usage): how often each expert of each layer was routed, older runs weighing
// less, kept in the user's state directory (a model directory is read-only input) so that a later
// run can start with the hottest experts resident (--warm-start).
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

// The user's state directory for moestream: $XDG_STATE_HOME/moestream, else
// ~/.local/state/moestream (/tmp/moestream-state without a home).
std::string state_dir();

// Where an engine directory's history lives unless --usage names a file: usage.json in
// state_dir()/<model id>/, the model id being its usage_fingerprint in hex, so copies of one
// model share it and nothing is written beside the model.
std::string default_usage_path(const EngineIndex& index);

// The files of a run's usage history: it reads `read` and writes `write`; `note` (one line, or
// empty) says why they differ. With --usage FILE both are FILE; by default both are
// default_usage_path, except that a usage.json beside the model is read while the state
// directory has none yet.
struct UsageFiles {
  std::string read, write, note;
};
UsageFiles usage_files(const std::string& dir, const EngineIndex& index, const std::string& usage_flag);

}  // namespace ms
