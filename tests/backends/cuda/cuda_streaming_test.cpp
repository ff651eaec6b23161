// The VRAM expert pool (backends/cuda/device_store.h) under the GPU forward: DESIGN.md invariant 1 on
// the GPU. A run whose pools hold a few experts per layer, fed from SSD through the host tier
// (staging or a cache) and the copy stream, is bit-identical to the run with every expert in
// VRAM; the tiers count what they did; budgets below the floor are refused by name. Built with
// the CUDA backend; skipped where no GPU is present.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "backends/cuda/cuda_executor.h"
#include "backends/cuda/device_store.h"
#include "model/streaming_support.h"
#include "kernels/cuda/device.h"
#include "backends/load.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_support.h"
#include "util/error.h"
#include "util/thread_pool.h"
#include "writers/convert.h"

namespace ms {
namespace {

#define MS_REQUIRE_GPU() \
  if (!cuda::cuda_available()) GTEST_SKIP() << "no CUDA device: the VRAM pool runs only on a machine with an NVIDIA GPU"

struct RunResult : test::RunResult {
  std::vector<LayerStats> vram, host;
  TierLoad vram_load;
};

ModelOptions on_gpu(int vram_slots = 0, uint64_t host_cache = 0) {
  ModelOptions o;
  o.device = Device::Cuda;
  o.experts.slots = vram_slots;
  o.host_cache = host_cache;
  return o;
}

// `save_usage`: the run's routing goes to the usage history (opt.usage) for a later warm start.
RunResult run_model(const std::string& dir, const ModelOptions& opt, const std::vector<int>& prompt, int n_new,
                    bool save_usage = false) {
  auto model = load_model(dir, opt);
  RunResult r{test::run_prompt(*model, prompt, n_new)};
  r.vram = vram_pool(*model)->stats();
  r.host = model->experts()->stats();
  r.vram_load = vram_pool(*model)->load();
  if (save_usage) model->save_usage();
  return r;
}

void expect_same_run(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.logits.size(), want.logits.size());
  ASSERT_EQ(std::memcmp(got.logits.data(), want.logits.data(), want.logits.size() * sizeof(float)), 0)
      << "logits differ at " << what;
  ASSERT_EQ(got.tokens, want.tokens) << what;
}

PrefetchStats prefetch_total(const std::vector<LayerStats>& layers) {
  PrefetchStats p;
  for (const LayerStats& l : layers) p += l.prefetch;
  return p;
}

std::vector<int> prompt_of(int n, int vocab) {
  std::vector<int> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + 11) % vocab);
  return p;
}

uint64_t slot_row_bytes(const std::string& dir) {
  const ModelConfig cfg = load_config(dir);
  uint64_t b = 0;
  for (const ExpertLayer& l : read_engine_index(dir, cfg).layers) b += l.stride;
  return b;
}

PoolStats total(const std::vector<LayerStats>& layers) {
  PoolStats t;
  for (const LayerStats& l : layers) t += l.pool;
  return t;
}

PlacementStats placed(const std::vector<LayerStats>& layers) {
  PlacementStats p;
  for (const LayerStats& l : layers) p += l.placed;
  return p;
}

void check_vram_streaming_is_exact(const std::string& dir, const std::vector<int>& prompt, int n_new) {
  const ModelConfig cfg = load_config(dir);
  const RunResult want = run_model(dir, on_gpu(), prompt, n_new);
  for (const LayerStats& l : want.vram) {  // every expert read into VRAM at load, none since
    EXPECT_EQ(l.pool.misses, uint64_t(0)) << l.name;
    EXPECT_EQ(l.resident, cfg.n_experts) << l.name;
  }
  const uint64_t row = slot_row_bytes(dir);
  for (int slots : {cfg.top_k, cfg.top_k + 1, (cfg.top_k + cfg.n_experts) / 2})
    for (PolicyKind policy : {PolicyKind::LRU, PolicyKind::LFU})
      // No host cache; a small one (a token's experts, and room for prefetch staging, which comes
      // out of it); one holding every expert.
      for (uint64_t host_cache : {uint64_t(0), row * uint64_t(2 * cfg.top_k), row * uint64_t(cfg.n_experts)})
        for (PrefetchMode prefetch : {PrefetchMode::Off, PrefetchMode::On}) {
          ModelOptions opt = on_gpu(slots, host_cache);
          opt.experts.policy = policy;
          // Prefetch (into VRAM staging from the host tier, and into the host tier's staging from
          // disk) changes timing only (model/predict.h).
          opt.experts.prefetch.mode = prefetch;
          const RunResult got = run_model(dir, opt, prompt, n_new);
          const std::string what = std::to_string(slots) + " VRAM slots, policy " + policy_name(policy) +
                                   ", host cache " + std::to_string(host_cache / row) + " rows, prefetch " +
                                   (prefetch == PrefetchMode::On ? "on" : "off");
          expect_same_run(got, want, what);
          const PoolStats v = total(got.vram), h = total(got.host);
          const PrefetchStats vp = prefetch_total(got.vram), hp = prefetch_total(got.host);
          EXPECT_GT(v.misses, uint64_t(0)) << what;
          // Every VRAM miss was copied once: promoted from VRAM staging, or up from the host tier
          // (the bytes the pool counts: its link's).
          uint64_t copied = 0;
          for (const LayerStats& l : got.vram) copied += (l.pool.misses - l.prefetch.used) * l.slot_bytes;
          EXPECT_EQ(v.bytes_read, copied) << what;
          // The host tier serves each VRAM miss not promoted from staging, and each expert the
          // hybrid decode computed on the CPU instead.
          EXPECT_EQ(h.hits + h.misses + vp.used, v.misses + placed(got.vram).cpu) << what;
          EXPECT_LE(vp.used + vp.wasted, vp.issued) << what;
          if (host_cache == 0) {
            EXPECT_EQ(h.hits, uint64_t(0)) << "staging keeps nothing: " << what;
          }
          // The host holds every expert (with prefetch on, staging takes some of its cache): each read once.
          if (host_cache == row * uint64_t(cfg.n_experts) && prefetch == PrefetchMode::Off) {
            for (const LayerStats& l : got.host) EXPECT_LE(l.pool.misses, uint64_t(cfg.n_experts)) << l.name << ", " << what;
          }
          // The decode steps predict where the VRAM pools stream; a forward of the prompt does not.
          // Experts the host tier holds are copied ahead into VRAM staging, the others handed to
          // the host tier's prefetch. Where the VRAM pools hold a token's experts and little more,
          // the host tier (a cache of every expert) holds nearly all that were ever routed, so
          // some predictions are copied from it; larger pools may hold every prediction the host
          // tier has (it holds only what VRAM missed).
          if (prefetch == PrefetchMode::On) {
            EXPECT_GT(vp.predicted, uint64_t(0)) << what;
            if (host_cache == row * uint64_t(cfg.n_experts) && slots <= cfg.top_k + 1) {
              EXPECT_GT(vp.issued, uint64_t(0)) << what;
            }
          } else {
            EXPECT_EQ(vp.predicted + hp.predicted, uint64_t(0)) << what;
          }
        }
  // Warm start from the usage history of a run (auto and pin): the VRAM pools begin with the
  // hottest experts, and the answer is the same.
  const std::string usage = test::scratch_dir("cuda-stream-usage") + "/usage.json";
  ModelOptions record = on_gpu((cfg.top_k + cfg.n_experts) / 2);
  record.usage = usage;
  record.warm_start = WarmStart::Off;
  expect_same_run(run_model(dir, record, prompt, n_new, true), want, "recording the usage history");
  for (WarmStart warm : {WarmStart::Auto, WarmStart::Pin}) {
    ModelOptions opt = record;
    opt.warm_start = warm;
    const RunResult got = run_model(dir, opt, prompt, n_new);
    const std::string what = std::string("warm start ") + warm_start_name(warm);
    expect_same_run(got, want, what);
    EXPECT_GT(got.vram_load.warmed, 0) << what;
    EXPECT_EQ(got.vram_load.pinned > 0, warm == WarmStart::Pin) << what;
    EXPECT_GT(got.vram_load.bytes, uint64_t(0)) << what;
  }
}

TEST(CudaStreaming, Qwen3NextTinyBf16RecordsAreBitIdenticalToAllResident) {
  MS_REQUIRE_GPU();
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", src);
  const std::string dir = test::scratch_dir("cuda-stream") + "/next16";
  convert_checkpoint({.from = src, .out = dir, .expert_bits = 16});
  check_vram_streaming_is_exact(dir, prompt_of(41, 1024), 6);
}

// Two layers' blobs swapped (same shape, same size): the host tier's read checks the record
// header (format version 2) and names the record it got, with or without --verify, staging or
// caching, before anything reaches VRAM.
TEST(CudaStreaming, SwappedLayerBlobsAreNamedBeforeReachingVram) {
  MS_REQUIRE_GPU();
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", src);
  const std::string dir = test::scratch_dir("cuda-swap") + "/model";
  convert_checkpoint({.from = src, .out = dir, .expert_bits = 4});
  namespace fs = std::filesystem;
  fs::rename(dir + "/experts/layer_000.bin", dir + "/experts/swap.bin");
  fs::rename(dir + "/experts/layer_001.bin", dir + "/experts/layer_000.bin");
  fs::rename(dir + "/experts/swap.bin", dir + "/experts/layer_001.bin");
  for (uint64_t host_cache : {uint64_t(0), slot_row_bytes(dir) * 8})
    for (bool verify : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "host_cache " << host_cache << " verify " << verify);
      ModelOptions opt = on_gpu(6, host_cache);
      opt.experts.verify = verify;
      auto model = load_model(dir, opt);
      const std::vector<int> prompt = prompt_of(32, 1024);
      State state = model->new_state();
      std::string error;
      try {
        model->forward(prompt.data(), int(prompt.size()), state);  // layer 0 reads first
      } catch (const Error& e) {
        error = e.what();
      }
      ASSERT_FALSE(error.empty()) << "a swapped blob was read unnoticed";
      EXPECT_NE(error.find("layer model.layers.0.mlp, expert"), std::string::npos) << error;
      EXPECT_NE(error.find("of layer model.layers.1.mlp"), std::string::npos) << error;
    }
}

TEST(CudaStreaming, PycoderQ4IsBitIdenticalToAllResident) {
  MS_REQUIRE_GPU();
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  check_vram_streaming_is_exact(dir, prompt_of(48, 8192), 6);
}

// The hybrid decode (backends/cuda/hybrid.h): wherever a decode token's experts run (in VRAM,
// copied there, or on the CPU from the host tier: every layer, the first layer, or each miss
// by cost with copies paced so slow that the CPU takes them), at any thread count, the run is
// bit-identical to the one with every expert in VRAM.
TEST(CudaHybrid, PycoderQ4IsBitIdenticalWhereverItsExpertsRun) {
  MS_REQUIRE_GPU();
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  const ModelConfig cfg = load_config(dir);
  const std::vector<int> prompt = prompt_of(40, 8192);
  const int n_new = 6;
  ModelOptions all = on_gpu();
  all.cpu_experts = {.mode = CpuExperts::Mode::Auto};  // the integer product, every expert in VRAM
  const RunResult want = run_model(dir, all, prompt, n_new);
  EXPECT_EQ(placed(want.vram).cpu, uint64_t(0)) << "every expert in VRAM";
  const uint64_t row = slot_row_bytes(dir);
  struct Mode {
    const char* what;
    CpuExperts cpu;
    double h2d_rate;
    PrefetchMode prefetch = PrefetchMode::Auto;
  };
  // With prefetch, predicted experts the CPU is to compute stay in host memory (for_cpu).
  const Mode modes[] = {{"every layer on the CPU", {.mode = CpuExperts::Mode::Layers, .layers = 1000}, 0},
                        {"the first layer on the CPU", {.mode = CpuExperts::Mode::Layers, .layers = 1}, 0},
                        {"auto, copies at 50 MB/s, prefetch off", {}, 5e7, PrefetchMode::Off},
                        {"auto, copies at 50 MB/s, prefetch on", {}, 5e7, PrefetchMode::On}};
  for (int threads : {1, 3}) {
    ThreadPool::set_global_threads(threads);
    for (int slots : {cfg.top_k, (cfg.top_k + cfg.n_experts) / 2})
      for (uint64_t host_cache : {uint64_t(0), row * uint64_t(cfg.n_experts)})
        for (const Mode& m : modes) {
          ModelOptions opt = on_gpu(slots, host_cache);
          opt.cpu_experts = m.cpu;
          opt.experts.h2d_rate = m.h2d_rate;
          opt.experts.prefetch.mode = m.prefetch;
          const RunResult got = run_model(dir, opt, prompt, n_new);
          const std::string what = std::string(m.what) + ", " + std::to_string(slots) + " VRAM slots, host cache " +
                                   std::to_string(host_cache / row) + " rows, " + std::to_string(threads) + " threads";
          expect_same_run(got, want, what);
          const PlacementStats p = placed(got.vram);
          EXPECT_GT(p.cpu, uint64_t(0)) << what;
          if (m.cpu.layers == 1000) {
            EXPECT_EQ(p.gpu + p.copied, uint64_t(0)) << what;
          }
          if (m.cpu.layers == 1) {
            EXPECT_GT(p.gpu + p.copied, uint64_t(0)) << what;
          }
          if (m.prefetch == PrefetchMode::On) {
            EXPECT_GT(prefetch_total(got.vram).for_cpu, uint64_t(0)) << what;
          }
        }
  }
  ThreadPool::set_global_threads(0);
}

TEST(CudaStreaming, VramBudgetSizesThePoolsAndRefusesBelowTheFloor) {
  MS_REQUIRE_GPU();
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  ModelOptions opt = on_gpu();
  opt.vram_budget = 1ull << 20;
  test::expect_error([&] { load_model(dir, opt); }, {"VRAM budget", "below the floor", "expert slots per layer"});
  opt.vram_budget = 256ull << 20;
  auto model = load_model(dir, opt);
  const MemoryPlan& p = model->memory_plan();
  EXPECT_GE(p.slots, model->config().top_k);
  EXPECT_LE(p.total(), opt.vram_budget);
  for (const LayerStats& l : vram_pool(*model)->stats()) EXPECT_EQ(l.capacity, p.slots) << l.name;
}

// A checkpoint directory has no expert store: its experts are dense weights in VRAM, and the
// budget's floor is those weights, the KV cache and the activations; what the embedding may take
// is what they leave.
TEST(CudaStreaming, VramBudgetOfACheckpointCountsItsWeights) {
  MS_REQUIRE_GPU();
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", src);
  ModelOptions opt = on_gpu();
  opt.vram_budget = 1ull << 30;
  const MemoryPlan p = load_model(src, opt)->memory_plan();
  EXPECT_GT(p.dense, 4ull << 20);  // the checkpoint's weights as copied to the GPU
  EXPECT_GT(p.kv, 0u);
  EXPECT_EQ(p.slots, 0);
  EXPECT_EQ(p.pool, 0u);
  opt.vram_budget = p.fixed() - 1;
  test::expect_error([&] { load_model(src, opt); }, {"VRAM budget", "below the floor", "dense weights", "moestream convert"});
  opt.vram_budget = p.fixed();
  EXPECT_EQ(load_model(src, opt)->memory_plan().total(), p.fixed());
}

TEST(CudaStreaming, HostCacheBelowOneTokenIsRefused) {
  MS_REQUIRE_GPU();
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  test::expect_error([&] { load_model(dir, on_gpu(8, 4096)); }, {"--host-cache", "one token's 8 experts"});
  test::expect_error([&] { load_model(dir, on_gpu(7)); }, {"7 VRAM expert slots", "one token's 8 routed experts"});
}

// A corrupt record found by --verify on its way to VRAM is named and never published: once the
// file is mended, the same forward gives what a fresh model gives.
TEST(CudaStreaming, CorruptRecordIsNamedAndNeverPublished) {
  MS_REQUIRE_GPU();
  const std::string dir = test::scratch_dir("cuda-corrupt") + "/model";
  std::filesystem::copy(std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4", dir,
                        std::filesystem::copy_options::recursive);
  const ModelConfig cfg = load_config(dir);
  const ExpertLayer layer = read_engine_index(dir, cfg).layers[2];
  const std::string blob = dir + "/" + layer.file;
  const auto at = std::streamoff(layer.stride * 5 + 100);
  char original[3];
  auto write_at = [&](const char* bytes) {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    if (bytes != original) f.read(original, 3);
    f.seekp(at);
    f.write(bytes, 3);
  };
  write_at("\x5a\x5a\x5a");
  ModelOptions opt = on_gpu(8);
  opt.experts.verify = true;
  opt.experts.direct_io = false;  // the mended bytes must be what the next read sees
  auto model = load_model(dir, opt);
  std::vector<int> failing;
  const std::string error = test::first_forward_error([&]() -> Model& { return *model; }, &failing);
  ASSERT_FALSE(error.empty()) << "expert 5 of layer 2 was never routed";
  EXPECT_NE(error.find("checksum mismatch"), std::string::npos) << error;
  EXPECT_NE(error.find(layer.name + ", expert 5"), std::string::npos) << error;
  write_at(original);
  State s = model->new_state(), f = model->new_state();
  const std::vector<float> got = model->forward(failing.data(), int(failing.size()), s).logits;
  const std::vector<float> want = load_model(dir, on_gpu())->forward(failing.data(), int(failing.size()), f).logits;
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace ms
