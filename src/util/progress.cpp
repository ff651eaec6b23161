#include "util/progress.h"

#include <cstdio>
#include <string>

namespace ms {

using Clock = std::chrono::steady_clock;

Progress::Progress(size_t total, bool enabled) : total_(total), enabled_(enabled), start_(Clock::now()) {}

void Progress::add(size_t n) {
  std::lock_guard lock(mu_);
  done_ += n;
  if (!enabled_) return;
  const auto now = Clock::now();
  if (now - last_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_ = now;
  draw(now);
}

void Progress::finish() {
  if (enabled_) std::fputc('\n', stderr);
}

void Progress::draw(Clock::time_point now) {
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double frac = total_ ? double(done_) / double(total_) : 1.0;
  const double rate = secs > 0 ? double(done_) / secs : 0.0;
  const double eta = rate > 0 ? double(total_ - done_) / rate : 0.0;
  constexpr int kWidth = 30;
  const int filled = int(frac * kWidth);
  std::string bar(size_t(filled), '=');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r[%s] %3.0f%%  %.1f / %.1f MB  %.1f MB/s  ETA %d:%02d ", bar.c_str(), frac * 100,
               double(done_) / 1e6, double(total_) / 1e6, rate / 1e6, int(eta) / 60, int(eta) % 60);
  std::fflush(stderr);
}

}  // namespace ms
