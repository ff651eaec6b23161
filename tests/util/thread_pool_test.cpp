// The thread pool against a serial loop: every item once, whatever the sizes and grains; calls
// back to back and from several threads; nested calls inline; exceptions reach the caller.
#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ms {
namespace {

TEST(ThreadPool, CoversEveryItemOnceForEverySizeAndGrain) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(7), size_t(64), size_t(1000), size_t(4099)})
      for (size_t grain : {size_t(1), size_t(3), size_t(16), size_t(5000)}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, [&](size_t b, size_t e) {
          ASSERT_LE(b, e);
          ASSERT_LE(e, n);
          for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
        }, grain);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
      }
  }
}

// Many short calls in a row, as a decode step makes them: each sees only its own items, and the
// sums come out as a serial loop's.
TEST(ThreadPool, BackToBackCallsKeepTheirItemsApart) {
  ThreadPool pool(3);
  std::vector<long> out(257);
  for (int call = 0; call < 20000; ++call) {
    const size_t n = size_t(call % 257) + 1;
    pool.parallel_for(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) out[i] = long(call) * 1000 + long(i);
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], long(call) * 1000 + long(i)) << "call " << call;
  }
}

// Workers asleep (the spin over) still wake for the next call.
TEST(ThreadPool, SleepingWorkersWakeForTheNextCall) {
  ThreadPool pool(2);
  for (int call = 0; call < 5; ++call) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> sum{0};
    pool.parallel_for(100, [&](size_t b, size_t e) { sum.fetch_add(int(e - b)); });
    EXPECT_EQ(sum.load(), 100);
  }
}

TEST(ThreadPool, CallsFromSeveralThreadsAreSerialised) {
  ThreadPool pool(2);
  std::vector<std::thread> callers;
  std::atomic<long> total{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int k = 0; k < 500; ++k) pool.parallel_for(64, [&](size_t b, size_t e) { total.fetch_add(long(e - b)); });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4L * 500 * 64);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(8, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) pool.parallel_for(10, [&](size_t ib, size_t ie) { inner.fetch_add(int(ie - ib)); });
  });
  EXPECT_EQ(inner.load(), 80);
}

TEST(ThreadPool, AnExceptionReachesTheCallerAfterEveryChunk) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(64, [&](size_t b, size_t e) {
    ran.fetch_add(int(e - b));
    if (b == 0) throw std::runtime_error("chunk 0");
  }), std::runtime_error);
  EXPECT_EQ(ran.load(), 64);
  std::atomic<int> after{0};  // the pool still works
  pool.parallel_for(10, [&](size_t b, size_t e) { after.fetch_add(int(e - b)); });
  EXPECT_EQ(after.load(), 10);
}

}  // namespace
}  // namespace ms
