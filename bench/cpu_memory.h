#pragma once
// What the CPU benchmarks measure against: the median time of a run, and the machine's
// streaming-read bandwidth over the threads the kernels use.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "util/thread_pool.h"

namespace ms::bench {

constexpr int kRuns = 7;

template <class Fn>
double median_seconds(Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> t;
  for (int i = 0; i < kRuns; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Streaming read of buf over the global pool's threads, in GB/s: the bandwidth ceiling for data
// that comes from memory rather than the caches.
inline double stream_read_gbs(const std::vector<uint64_t>& buf) {
  std::vector<uint64_t> sums(buf.size() / 4096 + 1);
  const double s = median_seconds([&] {
    ThreadPool::global().parallel_for(
        buf.size() / 4096,
        [&](size_t b, size_t e) {
          for (size_t blk = b; blk < e; ++blk) {
            const uint64_t* p = buf.data() + blk * 4096;
            uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (size_t i = 0; i < 4096; i += 4) a0 += p[i], a1 += p[i + 1], a2 += p[i + 2], a3 += p[i + 3];
            sums[blk] = a0 + a1 + a2 + a3;
          }
        },
        16);
  });
  return double(buf.size() * 8) / s / 1e9;
}

}  // namespace ms::bench
