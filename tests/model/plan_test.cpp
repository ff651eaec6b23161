// The memory plans (model/plan.h) as pure logic, with the budget the process may use given
// (ModelOptions::host_budget) instead of read from a cgroup: the CPU's default budget where no
// --memory is given, and the GPU's host tier with --host-cache auto.
#include "model/plan.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_support.h"

namespace ms {
namespace {

const std::string kQ4 = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";

struct Embedded {
  ModelConfig cfg = load_config(kQ4);
  EngineIndex index = read_engine_index(kQ4, cfg);
  uint64_t dense = std::filesystem::file_size(kQ4 + "/dense.safetensors");
  uint64_t row() const {
    uint64_t b = 0;
    for (const ExpertLayer& l : index.layers) b += l.stride;
    return b;
  }
};

ModelOptions with_budget(uint64_t bytes, Device device = Device::Cpu) {
  ModelOptions o;
  o.device = device;
  o.host_budget = HostBudget{bytes, {}, "a test's budget"};
  return o;
}

// No --memory: a model that fits the budget whole is not sized by it (the plan records what was
// checked); one that does not gets pools sized to it; slots asked for beyond it are refused.
TEST(DefaultBudgetPlan, SizesThePoolsOnlyWhereTheModelDoesNotFit) {
  const Embedded m;
  MemoryPlan plan;
  StoreOptions s = host_store_options(kQ4, m.cfg, m.index, m.dense, with_budget(uint64_t(1) << 30), plan);
  EXPECT_EQ(plan.slots, 0);
  EXPECT_EQ(s.slots, 0);  // unsized: every expert
  EXPECT_EQ(plan.budget, uint64_t(1) << 30);
  EXPECT_EQ(plan.source, "a test's budget");
  EXPECT_NE(describe(plan, Device::Cpu).find("(every expert fits: nothing sized by it)"), std::string::npos);

  const uint64_t tight = plan.fixed() + m.row() * 40;
  s = host_store_options(kQ4, m.cfg, m.index, m.dense, with_budget(tight), plan);
  EXPECT_GE(plan.slots, m.cfg.top_k);
  EXPECT_LT(plan.slots, m.cfg.n_experts);
  EXPECT_EQ(s.slots, plan.slots);
  EXPECT_LE(plan.total(), tight);
  EXPECT_TRUE(s.prefault);

  ModelOptions asked = with_budget(tight);
  asked.experts.slots = 120;
  test::expect_error([&] { host_store_options(kQ4, m.cfg, m.index, m.dense, asked, plan); },
                     {"--expert-slots", "a test's budget"});
}

// A budget below the default context's floor halves the prefill chunk, then the context, until
// the floor fits; a --context the user gave is kept, and the floor then refused with the source.
TEST(DefaultBudgetPlan, ATightBudgetPlansShorterChunksAndContext) {
  const Embedded m;
  MemoryPlan full;
  host_store_options(kQ4, m.cfg, m.index, m.dense, with_budget(uint64_t(1) << 30), full);
  const uint64_t tight = full.fixed() - full.activations / 2 - full.kv / 2;
  MemoryPlan plan;
  host_store_options(kQ4, m.cfg, m.index, m.dense, with_budget(tight), plan);
  EXPECT_LT(plan.prefill_chunk, kPrefillChunk);
  EXPECT_LT(plan.context, 4096);
  EXPECT_GE(plan.slots, m.cfg.top_k);
  EXPECT_LE(plan.total(), tight);
  ModelOptions given = with_budget(tight);
  given.context_given = true;
  test::expect_error([&] { host_store_options(kQ4, m.cfg, m.index, m.dense, given, plan); },
                     {"below the floor", "with no --memory the budget is a test's budget"});
}

// --host-cache auto on the GPU: every expert where the budget holds them all; else as many slots
// as fit beside the process's reserve and the prefetch staging; staging only where one token's
// experts do not fit.
TEST(HostTierPlan, AutoSizesTheHostTierFromTheBudget) {
  const Embedded m;
  ModelOptions o = with_budget(uint64_t(4) << 30, Device::Cuda);
  o.host_cache_auto = true;
  MemoryPlan plan;
  StoreOptions s = host_store_options(kQ4, m.cfg, m.index, m.dense, o, plan);
  EXPECT_TRUE(s.cache);
  EXPECT_EQ(s.slots, m.cfg.n_experts);
  EXPECT_EQ(plan.pool, m.row() * uint64_t(m.cfg.n_experts));
  EXPECT_NE(describe_host_tier(plan).find("128 slots a layer"), std::string::npos) << describe_host_tier(plan);
  EXPECT_NE(describe_host_tier(plan).find("from a test's budget"), std::string::npos) << describe_host_tier(plan);

  const uint64_t reserve = plan.process;  // the process's and the CUDA runtime's
  EXPECT_GT(reserve, process_reserve(kQ4));
  o.host_budget->bytes = reserve + m.row() * 48;
  s = host_store_options(kQ4, m.cfg, m.index, m.dense, o, plan = {});
  EXPECT_TRUE(s.cache);
  EXPECT_GE(s.slots, m.cfg.top_k);
  EXPECT_LT(s.slots, 48);  // the prefetch staging came out of it
  EXPECT_GT(plan.staging, 0u);
  EXPECT_LE(plan.process + plan.pool + plan.staging, o.host_budget->bytes);

  o.host_budget->bytes = reserve + m.row() * uint64_t(m.cfg.top_k - 1);
  s = host_store_options(kQ4, m.cfg, m.index, m.dense, o, plan = {});
  EXPECT_FALSE(s.cache);
  EXPECT_EQ(s.slots, m.cfg.top_k);  // staging for one token
  EXPECT_NE(describe_host_tier(plan).find("staging for one token only (--host-cache auto"), std::string::npos)
      << describe_host_tier(plan);

  ModelOptions off;  // --host-cache 0
  off.device = Device::Cuda;
  s = host_store_options(kQ4, m.cfg, m.index, m.dense, off, plan = {});
  EXPECT_FALSE(s.cache);
  EXPECT_EQ(describe_host_tier(plan), "host tier: staging for one token only (--host-cache 0)");
}

// --cpu-experts N under --vram: the first N MoE layers' pools keep the floor (one token's
// experts) and the slots they leave go to the other layers, none past its expert count.
TEST(VramPlan, StaticCpuLayersLeaveTheirSlotsToTheOthers) {
  const Embedded m;
  ModelOptions opt;
  opt.device = Device::Cuda;
  const int L = int(m.index.layers.size());
  // A budget whose pools hold some of each layer's experts.
  opt.vram_budget = m.dense + (uint64_t(24) << 20) + m.row() * uint64_t(m.cfg.n_experts) / 4;  // KV, activations
  MemoryPlan plan;
  const StoreOptions plain = vram_store_options(kQ4, m.cfg, m.index, m.dense, 0, opt, plan);
  ASSERT_GT(plain.slots, m.cfg.top_k);
  ASSERT_LT(plain.slots, m.cfg.n_experts);
  for (int n : {1, 3}) {
    opt.cpu_experts = {.mode = CpuExperts::Mode::Layers, .layers = n};
    const StoreOptions s = vram_store_options(kQ4, m.cfg, m.index, m.dense, 0, opt, plan);
    int64_t total = 0, plain_total = 0;
    for (int i = 0; i < L; ++i) {
      const ExpertLayer& l = m.index.layers[size_t(i)];
      const int cap = layer_capacity(s, l);
      total += cap;
      plain_total += layer_capacity(plain, l);
      if (i < n) EXPECT_EQ(cap, m.cfg.top_k) << l.name;
      else EXPECT_GE(cap, plain.slots) << l.name;
      EXPECT_LE(cap, l.n_experts) << l.name;
    }
    EXPECT_LE(total, plain_total) << n << " static layers";
    EXPECT_GT(total, plain_total - int64_t(L)) << n << " static layers: slots lost to rounding only";
  }
}

}  // namespace
}  // namespace ms
