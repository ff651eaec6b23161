// Many threads on one ExpertStore with tiny pools (and, with prefetch, tiny staging shared by
// every layer): every record a thread gets must be the expert it asked for, whole. Built into a
// ThreadSanitizer binary in CI (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "experts/expert_store.h"
#include "test_support.h"

namespace ms {
namespace {

constexpr int kLayers = 4, kExperts = 24, kThreadsPerLayer = 1;

// Record bytes: a function of (layer, expert, offset), so a wrong or torn record is detected.
uint8_t byte_of(int layer, int expert, size_t i) { return uint8_t((layer * 131 + expert * 29 + i * 7) & 0xff); }

EngineIndex write_store(const std::string& dir) {
  EngineIndex index;
  std::filesystem::create_directories(dir + "/experts");
  for (int l = 0; l < kLayers; ++l) {
    const std::string name = "model.layers." + std::to_string(l) + ".mlp";
    ExpertLayer layer = plan_expert_layer(name, expert_file_name(name), kExperts,
                                          {ProjSpec{4, 64, 64, 128}, ProjSpec{4, 64, 64, 128}, ProjSpec{4, 64, 128, 64}});
    std::ofstream out(dir + "/" + layer.file, std::ios::binary);
    std::vector<uint8_t> rec(layer.stride);
    for (int e = 0; e < kExperts; ++e) {
      for (size_t i = 0; i < layer.record_bytes; ++i) rec[i] = byte_of(l, e, i);
      write_record_header(layer, e, rec.data());
      layer.checksums.push_back(record_checksum(layer, rec.data()));
      out.write(reinterpret_cast<const char*>(rec.data()), std::streamsize(rec.size()));
    }
    index.layers.push_back(layer);
  }
  return index;
}

// Forwards use a layer one at a time; different layers proceed concurrently, sharing the I/O
// engine, while a stats reader (the server's /api/stats) polls. `mode`: the store's prefetch
// (Auto is on here, as these pools stream; nothing calls prefetch(): acquires alone).
void threads_on_tiny_pools(PrefetchMode mode) {
  const std::string dir = test::scratch_dir("stress");
  const EngineIndex index = write_store(dir);
  for (IoKind io : {IoKind::Uring, IoKind::Pread}) {
    ExpertStore store(dir, index, {.slots = 5, .policy = PolicyKind::LFU, .io = io, .verify = true, .prefetch = {.mode = mode}});
    ASSERT_EQ(store.prefetching(), mode != PrefetchMode::Off);
    std::atomic<bool> done{false};
    std::atomic<int> bad{0};
    std::vector<std::thread> workers;
    for (int l = 0; l < kLayers; ++l)
      for (int t = 0; t < kThreadsPerLayer; ++t)
        workers.emplace_back([&, l] {
          std::mt19937 rng(uint32_t(l * 7 + 1));
          const int li = store.layer_of("model.layers." + std::to_string(l) + ".mlp");
          for (int iter = 0; iter < 300; ++iter) {
            std::vector<int> want;
            while (want.size() < 4) {
              int e = int(rng() % kExperts);
              if (std::find(want.begin(), want.end(), e) == want.end()) want.push_back(e);
            }
            std::vector<const uint8_t*> recs = store.acquire(li, want);
            for (size_t j = 0; j < want.size(); ++j)
              for (size_t i = kRecordHeaderBytes; i < index.layers[size_t(l)].record_bytes; i += 97)
                if (recs[j][i] != byte_of(l, want[j], i)) ++bad;
            store.release(li);
          }
        });
    std::thread reader([&] {
      while (!done) {
        uint64_t hits = 0;
        for (const LayerStats& s : store.stats()) hits += s.pool.hits;
        (void)hits;
        std::this_thread::yield();
      }
    });
    for (auto& w : workers) w.join();
    done = true;
    reader.join();
    EXPECT_EQ(bad.load(), 0) << store.io_name();
    uint64_t misses = 0;
    for (const LayerStats& s : store.stats()) misses += s.pool.misses;
    EXPECT_GT(misses, 0u);
  }
}

TEST(ExpertStoreStress, ThreadsOnTinyPoolsAlwaysGetTheRightRecords) { threads_on_tiny_pools(PrefetchMode::Auto); }

// Without prefetch (no staging, so start_acquire takes no prefetch lock): the same, and under
// ThreadSanitizer no data race between the layers' acquires.
TEST(ExpertStoreStress, ThreadsOnTinyPoolsWithPrefetchOffAlwaysGetTheRightRecords) {
  threads_on_tiny_pools(PrefetchMode::Off);
}

// Prefetch with one or two staging buffers for all four layers: each layer's thread predicts
// (partly right, wider than staging) and then acquires its routed set, through acquire(), through
// start_acquire()/next(), or abandoning an Acquired half-way (a forward that threw); predictions
// of one layer drop the staged experts of another. A reader polls the stats meanwhile.
TEST(ExpertStoreStress, PrefetchIntoTinyStagingAlwaysGetsTheRightRecords) {
  const std::string dir = test::scratch_dir("stress-prefetch");
  const EngineIndex index = write_store(dir);
  // Every record as written, header included.
  std::vector<std::vector<std::vector<uint8_t>>> want(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    std::ifstream in(dir + "/" + index.layers[size_t(l)].file, std::ios::binary);
    for (int e = 0; e < kExperts; ++e) {
      std::vector<uint8_t> rec(index.layers[size_t(l)].stride);
      in.read(reinterpret_cast<char*>(rec.data()), std::streamsize(rec.size()));
      rec.resize(index.layers[size_t(l)].record_bytes);
      want[size_t(l)].push_back(std::move(rec));
    }
  }
  for (IoKind io : {IoKind::Uring, IoKind::Pread})
    for (int staging : {1, 2}) {
      SCOPED_TRACE(staging);
      StoreOptions opt{.slots = 5, .policy = PolicyKind::LRU, .io = io, .verify = true, .top_k = 4};
      opt.prefetch = {.mode = PrefetchMode::On, .width = 3, .staging = staging};
      ExpertStore store(dir, index, opt);
      ASSERT_TRUE(store.prefetching());
      ASSERT_EQ(store.staging_buffers(), staging);
      std::atomic<bool> done{false};
      std::atomic<int> bad{0}, handed{0};
      std::vector<std::thread> workers;
      for (int l = 0; l < kLayers; ++l)
        workers.emplace_back([&, l] {
          std::mt19937 rng(uint32_t(l * 13 + staging));
          const int li = store.layer_of("model.layers." + std::to_string(l) + ".mlp");
          const size_t rec_bytes = index.layers[size_t(l)].record_bytes;
          auto distinct = [&](size_t n, std::vector<int> v) {
            while (v.size() < n)
              if (int e = int(rng() % kExperts); std::find(v.begin(), v.end(), e) == v.end()) v.push_back(e);
            return v;
          };
          auto check = [&](const uint8_t* rec, int e) {
            if (std::memcmp(rec, want[size_t(l)][size_t(e)].data(), rec_bytes) != 0) ++bad;
            ++handed;
          };
          for (int iter = 0; iter < 200; ++iter) {
            const std::vector<int> routed = distinct(4, {});
            std::vector<int> predicted(routed.begin(), routed.begin() + int(rng() % 4));
            store.prefetch(li, distinct(6, predicted), int(rng() % 2) + 1);
            if (iter % 7 == 0) store.prefetch((li + 1) % kLayers, distinct(3, {}));  // a layer ahead
            switch (iter % 3) {
              case 0: {
                const std::vector<const uint8_t*> recs = store.acquire(li, routed);
                for (size_t j = 0; j < routed.size(); ++j) check(recs[j], routed[j]);
                break;
              }
              case 1: {
                Acquired a = store.start_acquire(li, routed);
                for (int i; (i = a.next()) >= 0;) check(a.records[size_t(i)], routed[size_t(i)]);
                break;
              }
              default: {  // an early end: the Acquired waits for its reads and frees their slots
                Acquired a = store.start_acquire(li, routed);
                for (int k = int(rng() % 3); k > 0; --k)
                  if (const int i = a.next(); i >= 0) check(a.records[size_t(i)], routed[size_t(i)]);
                break;
              }
            }
            store.release(li);
          }
        });
      std::thread reader([&] {
        while (!done) {
          uint64_t n = 0;
          for (const LayerStats& s : store.stats()) n += s.pool.hits + s.prefetch.used + s.prefetch.wasted;
          n += uint64_t(store.prefetch_width()) + uint64_t(store.mean_prefetch_width()) + store.io_counters().bytes;
          (void)n;
          std::this_thread::yield();
        }
      });
      for (auto& w : workers) w.join();
      done = true;
      reader.join();
      EXPECT_EQ(bad.load(), 0) << store.io_name() << ": of " << handed.load() << " records handed over";
      PrefetchStats p;
      for (const LayerStats& s : store.stats()) p += s.prefetch;
      EXPECT_GT(p.issued, 0u);
      EXPECT_GT(p.used, 0u);
      EXPECT_GT(p.no_buffer, 0u) << "the predictions are wider than staging";
      EXPECT_LE(p.wasted, p.issued);
      EXPECT_LE(p.issued + p.no_buffer, p.predicted);
    }
}

}  // namespace
}  // namespace ms
