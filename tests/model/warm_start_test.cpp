// What an engine directory's pools hold before the first token (Model::prepare_pools): a model
// whose experts all fit is read whole at load and never misses; otherwise warm start reads each
// layer's hottest experts by the usage history, which changes what is resident and nothing else.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "backends/load.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_support.h"

namespace ms {
namespace {

const std::string kQ4 = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
const std::vector<int> kPromptA = {563, 279, 1002, 14, 220, 9, 87, 1500, 33};
const std::vector<int> kPromptB = {4000, 12, 777, 301, 45, 2020};

uint64_t total_records(const ExpertStore& s) {
  uint64_t n = 0;
  for (const ExpertLayer& l : s.index().layers) n += uint64_t(l.n_experts);
  return n;
}

TEST(LoadWhole, EveryExpertIsReadOnceAtLoadAndNeverMissed) {
  ModelOptions opt;
  auto model = load_model(kQ4, opt);
  ExpertStore& s = *model->experts();
  EXPECT_TRUE(model->warm_report().loaded_whole);
  const IoCounters at_load = s.io_counters();
  EXPECT_EQ(at_load.demand_reads, total_records(s));
  State st = model->new_state();
  generate_greedy(*model, st, kPromptA, {.max_tokens = 24, .stop_at_eos = false});
  PoolStats total;
  for (const LayerStats& l : s.stats()) total += l.pool;
  EXPECT_EQ(total.misses, 0u);
  EXPECT_GT(total.hits, 0u);
  EXPECT_EQ(s.io_counters().demand_reads, at_load.demand_reads);
  // Asked not to, the same pools fill by misses.
  opt.load_whole = false;
  auto lazy = load_model(kQ4, opt);
  EXPECT_FALSE(lazy->warm_report().loaded_whole);
  EXPECT_EQ(lazy->experts()->io_counters().demand_reads, 0u);
}

struct WarmRun {
  std::vector<int> tokens;
  std::vector<float> logits;
  WarmReport warm;
  ExpertStore::Early early;
};

WarmRun run_b(const std::string& usage, WarmStart mode) {
  ModelOptions opt;
  opt.experts.slots = 16;
  opt.usage = usage;
  opt.warm_start = mode;
  auto model = load_model(kQ4, opt);
  WarmRun r;
  r.warm = model->warm_report();
  State s = model->new_state();
  r.logits = model->forward(kPromptB.data(), int(kPromptB.size()), s, {.all_logits = true}).logits;
  State g = model->new_state();
  r.tokens = generate_greedy(*model, g, kPromptB, {.max_tokens = 64, .stop_at_eos = false});
  r.early = model->experts()->early();
  return r;
}

TEST(WarmStart, ChangesWhatIsResidentAndNothingElse) {
  const std::string usage = test::scratch_dir("warm") + "/usage.json";
  {  // an earlier run over another prompt leaves its history
    ModelOptions opt;
    opt.experts.slots = 16;
    opt.usage = usage;
    auto model = load_model(kQ4, opt);
    EXPECT_FALSE(model->warm_report().loaded_whole);
    State s = model->new_state();
    generate_greedy(*model, s, kPromptA, {.max_tokens = 64, .stop_at_eos = false});
    model->save_usage();
  }
  const WarmRun off = run_b(usage, WarmStart::Off), automatic = run_b(usage, WarmStart::Auto), pin = run_b(usage, WarmStart::Pin);
  EXPECT_EQ(off.warm.warmed, 0);
  EXPECT_GT(automatic.warm.warmed, 0);
  EXPECT_EQ(automatic.warm.pinned, 0);
  EXPECT_GT(pin.warm.pinned, 0);
  EXPECT_EQ(pin.warm.pinned, pin.warm.warmed);
  for (const WarmRun* r : {&automatic, &pin}) {
    EXPECT_EQ(r->tokens, off.tokens);
    ASSERT_EQ(r->logits.size(), off.logits.size());
    EXPECT_EQ(std::memcmp(r->logits.data(), off.logits.data(), off.logits.size() * sizeof(float)), 0);
    EXPECT_EQ(r->early.tokens, ExpertStore::kEarlyTokens);
  }
  std::printf("first %d tokens' hit rate at 16 slots: cold %.3f, warm auto %.3f, warm pin %.3f\n", off.early.tokens,
              off.early.pool.hit_rate(), automatic.early.pool.hit_rate(), pin.early.pool.hit_rate());
}

TEST(WarmStart, ADamagedHistoryIsIgnoredWithAWarning) {
  const std::string usage = test::scratch_dir("warm-bad") + "/usage.json";
  std::ofstream(usage) << "{\"format\": \"moestream-usage\", \"version\": 1, \"mod";
  const WarmRun r = run_b(usage, WarmStart::Auto);
  EXPECT_EQ(r.warm.warmed, 0);
  EXPECT_NE(r.warm.note.find(usage), std::string::npos) << r.warm.note;
  EXPECT_NE(r.warm.note.find("ignored"), std::string::npos) << r.warm.note;
}

}  // namespace
}  // namespace ms
