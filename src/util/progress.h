#pragma once
// A progress bar on stderr: bytes done of the total, rate and time left.
#include <chrono>
#include <cstddef>
#include <mutex>

namespace ms {

// A progress bar (bytes, rate, ETA) on stderr when enabled; add() may be called from workers.
class Progress {
 public:
  Progress(size_t total, bool enabled);
  void add(size_t n);
  void finish();

 private:
  void draw(std::chrono::steady_clock::time_point now);

  std::mutex mu_;
  size_t total_, done_ = 0;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_{};
};

}  // namespace ms
