// State checkpoints: restoring a checkpoint and continuing equals never having advanced.
#include <gtest/gtest.h>

#include <set>

#include "backends/load.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "util/error.h"
#include "test_support.h"

namespace ms {
namespace {

void check_restore_equals_never_advanced(const std::string& dir) {
  auto model = load_model(dir);
  const std::vector<int> prompt{5, 17, 3, 99, 42, 7, 8};
  const std::vector<int> draft{11, 12, 13};   // tokens that will be "rejected"
  const std::vector<int> actual{21, 22, 23, 24};

  State clean = model->new_state();
  model->forward(prompt.data(), int(prompt.size()), clean);
  ForwardResult want = model->forward(actual.data(), int(actual.size()), clean, {.all_logits = true});

  State s = model->new_state();
  model->forward(prompt.data(), int(prompt.size()), s);
  State::Checkpoint cp = s.checkpoint();
  model->forward(draft.data(), int(draft.size()), s);  // advance, then roll back
  for (int t : draft) model->forward(&t, 1, s);
  s.restore(cp);
  EXPECT_EQ(s.position(), int(prompt.size()));
  ForwardResult got = model->forward(actual.data(), int(actual.size()), s, {.all_logits = true});
  EXPECT_EQ(got.logits, want.logits);  // bit-identical

  // Prefill in pieces and token by token reach the same state as one batched prefill.
  State pieces = model->new_state();
  model->forward(prompt.data(), 3, pieces);
  for (size_t i = 3; i < prompt.size(); ++i) model->forward(&prompt[i], 1, pieces);
  ForwardResult p = model->forward(actual.data(), int(actual.size()), pieces, {.all_logits = true});
  for (size_t i = 0; i < p.logits.size(); ++i) ASSERT_NEAR(p.logits[i], want.logits[i], 1e-4);
}

TEST(State, RestoreThenContinueEqualsNeverAdvancedQwen3Next) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", dir);
  check_restore_equals_never_advanced(dir);
}

TEST(State, RestoreThenContinueEqualsNeverAdvancedQwen3Moe) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  check_restore_equals_never_advanced(dir);
}

TEST(State, RestoreAheadOfPositionIsRefused) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", dir);
  auto model = load_model(dir);
  State s = model->new_state();
  const int ids[] = {1, 2, 3};
  model->forward(ids, 3, s);
  State::Checkpoint cp = s.checkpoint();
  s.restore(model->new_state().checkpoint());
  EXPECT_THROW(s.restore(cp), Error);
}

TEST(State, KvCapacityDoublesButStopsAtThePlannedContext) {
  EXPECT_EQ(kv_capacity(5, 0, 4096), 5);
  EXPECT_EQ(kv_capacity(9, 8, 4096), 16);
  EXPECT_EQ(kv_capacity(3000, 2048, 4096), 4096);  // doubling would pass the plan
  EXPECT_EQ(kv_capacity(4000, 4096, 4096), 4096);  // already there
  EXPECT_EQ(kv_capacity(4097, 4096, 4096), 8192);  // past the plan: doubles again
  EXPECT_EQ(kv_capacity(5000, 2048, 4096), 5000);
  EXPECT_EQ(kv_capacity(100, 64, 0), 128);  // no plan
}

// A sequence within ModelOptions::context keeps its KV caches within it, the memory plan's count.
TEST(State, KvCachesStayWithinThePlannedContext) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", dir);
  ModelOptions opt;
  opt.device = Device::Cpu;
  opt.context = 40;
  auto model = load_model(dir, opt);
  const ModelConfig& cfg = model->config();
  State s = model->new_state();
  ASSERT_EQ(s.planned_positions(), 40);
  std::vector<int> prompt(30);
  for (int i = 0; i < 30; ++i) prompt[size_t(i)] = 3 + i;
  model->forward(prompt.data(), 30, s);
  auto capacities = [&] {  // positions, over the full-attention layers
    std::set<size_t> c;
    for (int l = 0; l < cfg.n_layers; ++l)
      if (cfg.layer_types[size_t(l)] == LayerType::FullAttention)
        c.insert(s.kv(l).k.capacity() / s.kv(l).k_stride());
    return c;
  };
  for (int t = 30; t < 40; ++t) model->forward(&t, 1, s);
  EXPECT_EQ(capacities(), std::set<size_t>{40});
  const int more = 40;
  model->forward(&more, 1, s);  // past the plan: it grows
  EXPECT_EQ(capacities(), std::set<size_t>{80});
}

}  // namespace
}  // namespace ms
