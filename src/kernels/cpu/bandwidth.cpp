#include "kernels/cpu/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "util/memory.h"
#include "util/thread_pool.h"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/bandwidth.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace ms::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Σ of p's u32 words (mod 2^32) in four independent chains, `prefetch` bytes ahead (0: none).
uint32_t ReadSum(const uint8_t* HWY_RESTRICT p, size_t bytes, size_t prefetch) {
  const hn::ScalableTag<uint32_t> d;
  const size_t V = hn::Lanes(d) * sizeof(uint32_t);
  auto a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 4 * V <= bytes; i += 4 * V) {
    if (prefetch)
      for (size_t b = 0; b < 4 * V; b += 64) __builtin_prefetch(p + i + b + prefetch);
    const auto* w = reinterpret_cast<const uint32_t*>(p + i);
    a0 = hn::Add(a0, hn::LoadU(d, w));
    a1 = hn::Add(a1, hn::LoadU(d, w + hn::Lanes(d)));
    a2 = hn::Add(a2, hn::LoadU(d, w + 2 * hn::Lanes(d)));
    a3 = hn::Add(a3, hn::LoadU(d, w + 3 * hn::Lanes(d)));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

}  // namespace HWY_NAMESPACE
}  // namespace ms::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ms::cpu {

HWY_EXPORT(ReadSum);

namespace {

constexpr size_t kBlock = size_t(16) << 20;

template <class Fn>
double median_seconds(int runs, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

Bandwidth measure_bandwidth(size_t bytes, int runs) {
  const size_t blocks = std::max<size_t>(2, bytes / kBlock);
  bytes = blocks * kBlock;
  ResidentMemory buf(bytes, "the bandwidth measurement's buffer");
  std::memset(buf.data(), 1, bytes);
  ThreadPool& pool = ThreadPool::global();
  Bandwidth bw;
  bw.threads = pool.size();
  std::atomic<uint32_t> sink{0};  // keeps the sums live
  for (const int prefetch : {0, 1024, 4096}) {
    const double s = median_seconds(runs, [&] {
      pool.parallel_for(blocks, [&](size_t b, size_t e) {
        uint32_t sum = 0;
        for (size_t i = b; i < e; ++i)
          sum += HWY_DYNAMIC_DISPATCH(ReadSum)(buf.data() + i * kBlock, kBlock, size_t(prefetch));
        sink.fetch_add(sum, std::memory_order_relaxed);
      });
    });
    if (const double gbs = double(bytes) / s / 1e9; gbs > bw.read_gbs) bw.read_gbs = gbs, bw.prefetch = prefetch;
  }
  const size_t half = blocks / 2;
  const double s = median_seconds(runs, [&] {
    pool.parallel_for(half, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) std::memcpy(buf.data() + (half + i) * kBlock, buf.data() + i * kBlock, kBlock);
    });
  });
  bw.copy_gbs = 2.0 * double(half * kBlock) / s / 1e9;
  return bw;
}

}  // namespace ms::cpu
#endif  // HWY_ONCE
