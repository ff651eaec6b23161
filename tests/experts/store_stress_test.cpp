// Many threads on one ExpertStore with tiny pools: every record a thread gets must be the
// expert it asked for, whole. Built into a ThreadSanitizer binary in CI (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <atomic>
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
      layer.checksums.push_back(record_checksum(rec.data(), layer.record_bytes));
      out.write(reinterpret_cast<const char*>(rec.data()), std::streamsize(rec.size()));
    }
    index.layers.push_back(layer);
  }
  return index;
}

TEST(ExpertStoreStress, ThreadsOnTinyPoolsAlwaysGetTheRightRecords) {
  const std::string dir = test::scratch_dir("stress");
  const EngineIndex index = write_store(dir);
  for (IoKind io : {IoKind::Uring, IoKind::Pread}) {
    ExpertStore store(dir, index, {.slots = 5, .policy = PolicyKind::LFU, .io = io, .verify = true});
    std::atomic<bool> done{false};
    std::atomic<int> bad{0};
    // Forwards use a layer one at a time; different layers proceed concurrently, sharing the
    // I/O engine, while a stats reader (the server's /api/stats) polls.
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

}  // namespace
}  // namespace ms
