// Predictive expert streaming's parts (experts/prefetch.h) and the expert store with prefetch on,
// on real synthesized engine directories read through io_uring and pread: a prefetch changes
// which reads happen and when, never the records routing gets nor the pool's own state, and a
// corrupt record read ahead fails exactly where and how a demand read of it would.
#include "experts/prefetch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "experts/expert_store.h"
#include "format/config.h"
#include "synth_support.h"
#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

// ---- parsing -------------------------------------------------------------------------------

TEST(PrefetchOptions, ModesParseAndAnUnknownOneIsNamed) {
  EXPECT_EQ(parse_prefetch_mode("off"), PrefetchMode::Off);
  EXPECT_EQ(parse_prefetch_mode("on"), PrefetchMode::On);
  EXPECT_EQ(parse_prefetch_mode("auto"), PrefetchMode::Auto);
  expect_error([] { parse_prefetch_mode("yes"); }, {"'yes'", "off, on or auto"});
  expect_error([] { parse_prefetch_mode(""); }, {"''", "off, on or auto"});
}

TEST(PrefetchOptions, AheadIsOneNumberOrAScheduleWithACutoff) {
  PrefetchOptions o;
  parse_prefetch_ahead("2", o);
  EXPECT_EQ(o.ahead, 2);
  EXPECT_EQ(o.ahead_early, 2);
  EXPECT_EQ(o.cutoff, 0);
  EXPECT_EQ(o.max_ahead(), 2);
  EXPECT_EQ(o.ahead_of(0), 2);
  EXPECT_EQ(o.ahead_of(40), 2);

  parse_prefetch_ahead("3,1@12", o);
  EXPECT_EQ(o.ahead_early, 3);
  EXPECT_EQ(o.ahead, 1);
  EXPECT_EQ(o.cutoff, 12);
  EXPECT_EQ(o.max_ahead(), 3);
  EXPECT_EQ(o.ahead_of(11), 3);
  EXPECT_EQ(o.ahead_of(12), 1);
  EXPECT_EQ(o.ahead_of(30), 1);

  parse_prefetch_ahead("1,2@0", o);  // cutoff 0: every layer uses the later value
  EXPECT_EQ(o.ahead_of(0), 2);
  EXPECT_EQ(o.max_ahead(), 2);

  // A plain number after a schedule resets the cutoff.
  parse_prefetch_ahead("1", o);
  EXPECT_EQ(o.cutoff, 0);
  EXPECT_EQ(o.ahead_early, 1);
  EXPECT_EQ(o.ahead_of(0), 1);
}

TEST(PrefetchOptions, BadAheadIsNamedWithItsText) {
  struct Case {
    const char* text;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"0", {"prefetch ahead '0'", "'0' is not a number of at least 1"}},
      {"-1", {"prefetch ahead '-1'", "at least 1"}},
      {"x", {"prefetch ahead 'x'", "'x'"}},
      {"", {"prefetch ahead ''"}},
      {"2x", {"prefetch ahead '2x'"}},
      {"99999999999", {"'99999999999'"}},
      {"5000", {"'5000'"}},
      {"2,1", {"prefetch ahead '2,1'", "neither A nor E,A@C"}},
      {"2@4", {"prefetch ahead '2@4'", "neither A nor E,A@C"}},
      {"1@4,2", {"prefetch ahead '1@4,2'", "neither A nor E,A@C"}},
      {"0,1@4", {"prefetch ahead '0,1@4'", "the early layers' ahead '0'"}},
      {"2,y@4", {"prefetch ahead '2,y@4'", "the later layers' ahead 'y'"}},
      {"2,0@4", {"the later layers' ahead '0'"}},
      {"2,1@", {"prefetch ahead '2,1@'", "the cutoff layer ''"}},
      {"2,1@-3", {"the cutoff layer '-3'"}},
      {",1@4", {"the early layers' ahead ''"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    PrefetchOptions o;
    expect_error([&] { parse_prefetch_ahead(c.text, o); }, c.parts);
  }
}

TEST(PrefetchOptions, WidthIsAutoOrAPositiveNumber) {
  EXPECT_EQ(parse_prefetch_width("auto"), 0);
  EXPECT_EQ(parse_prefetch_width("1"), 1);
  EXPECT_EQ(parse_prefetch_width("12"), 12);
  for (const char* bad : {"0", "-2", "", "3x", "x", "Auto", "99999999999"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { parse_prefetch_width(bad); },
                 {std::string("prefetch width '") + bad + "'", "neither auto nor a number of experts >= 1"});
  }
}

TEST(PrefetchOptions, StagingDefaultsToTwiceTheWidestWidthTimesTheLayersAhead) {
  EXPECT_EQ(min_prefetch_width(1), 1);
  EXPECT_EQ(min_prefetch_width(8), 4);
  EXPECT_EQ(max_prefetch_width(8), 16);
  EXPECT_EQ(max_prefetch_width(1), 2);

  PrefetchOptions o;  // adaptive width, one layer ahead
  EXPECT_EQ(staging_buffers(o, 8), 2 * 16);
  EXPECT_EQ(staging_buffers(o, 4), 2 * 8);
  parse_prefetch_ahead("2", o);
  EXPECT_EQ(staging_buffers(o, 8), 2 * 16 * 2);
  parse_prefetch_ahead("3,1@4", o);  // the largest ahead counts
  EXPECT_EQ(staging_buffers(o, 8), 2 * 16 * 3);
  o.width = 5;  // a fixed width is the widest
  EXPECT_EQ(staging_buffers(o, 8), 2 * 5 * 3);
  o.staging = 7;  // asked for: exactly that
  EXPECT_EQ(staging_buffers(o, 8), 7);
  o.staging = 1;
  EXPECT_EQ(staging_buffers(o, 8), 1);
}

TEST(PrefetchStats, SumsAndSummarizes) {
  PrefetchStats a{.predicted = 10, .issued = 8, .used = 6, .wasted = 1, .no_buffer = 2, .bytes = 800};
  PrefetchStats b{.predicted = 5, .issued = 2, .used = 0, .wasted = 2, .no_buffer = 0, .bytes = 200};
  a += b;
  EXPECT_EQ(a.predicted, 15u);
  EXPECT_EQ(a.issued, 10u);
  EXPECT_EQ(a.used, 6u);
  EXPECT_EQ(a.wasted, 3u);
  EXPECT_EQ(a.no_buffer, 2u);
  EXPECT_EQ(a.bytes, 1000u);
  const PrefetchSummary s = summarize(a, 12);
  EXPECT_DOUBLE_EQ(s.recall, 0.5);
  EXPECT_DOUBLE_EQ(s.waste, 0.4);
  EXPECT_EQ(s.demand_misses, 6u);
  const PrefetchSummary none = summarize({}, 0);
  EXPECT_EQ(none.recall, 0.0);
  EXPECT_EQ(none.waste, 0.0);
  EXPECT_EQ(none.demand_misses, 0u);
}

// ---- the width -----------------------------------------------------------------------------

TEST(WidthController, NarrowsUnderContentionWhileMostReadsAreWasted) {
  WidthController w(8, 4, 16);
  w.update(/*issued=*/10, /*used=*/2, /*demand_misses=*/5, /*behind=*/3);
  EXPECT_EQ(w.width(), 7);
  for (int i = 0; i < 20; ++i) w.update(10, 2, 5, 3);
  EXPECT_EQ(w.width(), 4) << "never below its floor";
  // Contended but mostly used: the prefetch earns its bandwidth, no change.
  WidthController u(8, 4, 16);
  u.update(10, 6, 5, 3);
  EXPECT_EQ(u.width(), 8);
  u.update(10, 5, 5, 3);  // exactly half used is not mostly wasted
  EXPECT_EQ(u.width(), 8);
  // Wasted but uncontended: the disk had room, no reason to narrow (nor to widen).
  u.update(10, 1, 5, 0);
  EXPECT_EQ(u.width(), 8);
}

TEST(WidthController, WidensWithHeadroomAndDemandMissesLeft) {
  WidthController w(8, 4, 16);
  w.update(/*issued=*/4, /*used=*/4, /*demand_misses=*/3, /*behind=*/0);
  EXPECT_EQ(w.width(), 9);
  w.update(0, 0, 1, 0);  // nothing read ahead yet: nothing wasted
  EXPECT_EQ(w.width(), 10);
  for (int i = 0; i < 20; ++i) w.update(4, 4, 3, 0);
  EXPECT_EQ(w.width(), 16) << "never above its ceiling";
  // No misses left to avoid: no reason to widen.
  WidthController n(8, 4, 16);
  n.update(4, 4, 0, 0);
  EXPECT_EQ(n.width(), 8);
  // A demand read waited behind prefetch: not headroom.
  n.update(4, 4, 3, 1);
  EXPECT_EQ(n.width(), 8);
}

TEST(WidthController, StaysWithinBoundsAndAFixedWidthStaysFixed) {
  std::mt19937 rng(5);
  WidthController w(4, 2, 8);
  double sum = 0;
  for (int i = 0; i < 500; ++i) {
    const uint64_t issued = rng() % 12, used = rng() % (issued + 1);
    w.update(issued, used, rng() % 6, rng() % 3);
    ASSERT_GE(w.width(), 2);
    ASSERT_LE(w.width(), 8);
    sum += w.width();
  }
  EXPECT_DOUBLE_EQ(w.mean(), sum / 500);

  WidthController fixed(5, 5, 5);
  EXPECT_DOUBLE_EQ(fixed.mean(), 5.0) << "before any window: the width itself";
  for (int i = 0; i < 50; ++i) {
    fixed.update(10, 0, 5, 3);  // would narrow
    EXPECT_EQ(fixed.width(), 5);
    fixed.update(4, 4, 3, 0);  // would widen
    EXPECT_EQ(fixed.width(), 5);
  }
  EXPECT_DOUBLE_EQ(fixed.mean(), 5.0);
}

// ---- staging -------------------------------------------------------------------------------

// A read landed: what the I/O engine does on completion.
void land(Staging::Entry* e) { e->read.finished.store(true, std::memory_order_release); }

TEST(Staging, BuffersAreAlignedAndDistinct) {
  Staging s(3, 8192);
  EXPECT_EQ(s.buffers(), 3);
  EXPECT_EQ(s.bytes(), 3u * 8192u);
  for (size_t i = 0; i < s.entries().size(); ++i) {
    const Staging::Entry& e = *s.entries()[i];
    EXPECT_EQ(e.layer, -1);
    EXPECT_TRUE(e.read.done()) << "nothing in flight at start";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(e.data) % 4096, 0u) << "O_DIRECT reads land there";
    if (i > 0) {
      EXPECT_GE(e.data, s.entries()[i - 1]->data + 8192);
    }
  }
}

TEST(Staging, TakesAFreeBufferBeforeDroppingAFinishedOne) {
  Staging s(3, 4096);
  int dropped = 99;
  Staging::Entry* a = s.take(0, 1, &dropped);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(dropped, -1);
  EXPECT_FALSE(a->read.done()) << "not to be used before its read is submitted";
  EXPECT_EQ(s.find(0, 1), a);
  land(a);
  dropped = 99;
  Staging::Entry* b = s.take(0, 2, &dropped);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(b, a) << "a free buffer goes first, even with a finished unclaimed one";
  EXPECT_EQ(dropped, -1);
  EXPECT_EQ(s.find(0, 1), a);
  land(b);
  Staging::Entry* c = s.take(1, 3, &dropped);
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(dropped, -1);
  land(c);
  // Full: the oldest finished unclaimed (layer 0, expert 1) goes, its layer reported.
  Staging::Entry* d = s.take(2, 4, &dropped);
  EXPECT_EQ(d, a);
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(s.find(0, 1), nullptr);
  EXPECT_EQ(s.find(2, 4), a);
  EXPECT_EQ(d->layer, 2);
  EXPECT_EQ(d->expert, 4);
  EXPECT_FALSE(d->claimed);
  land(d);
  // Next oldest: (0, 2).
  EXPECT_EQ(s.take(3, 5, &dropped), b);
  EXPECT_EQ(dropped, 0);
  land(b);
  // Then (1, 3).
  EXPECT_EQ(s.take(3, 6, &dropped), c);
  EXPECT_EQ(dropped, 1);
  land(c);
  // A freed buffer is free again: taken without a drop.
  s.free(a);
  EXPECT_EQ(s.find(2, 4), nullptr);
  EXPECT_EQ(s.take(0, 7, &dropped), a);
  EXPECT_EQ(dropped, -1);
}

TEST(Staging, NeverDropsAClaimedOrInFlightBuffer) {
  Staging s(3, 4096);
  int dropped = 99;
  Staging::Entry* a = s.take(0, 1, &dropped);  // oldest
  Staging::Entry* b = s.take(0, 2, &dropped);
  Staging::Entry* c = s.take(0, 3, &dropped);
  ASSERT_TRUE(a && b && c);
  // All in flight: nothing to take.
  dropped = 99;
  EXPECT_EQ(s.take(1, 9, &dropped), nullptr);
  land(a);
  land(b);
  land(c);
  a->claimed = true;  // an acquire is promoting the oldest
  Staging::Entry* d = s.take(1, 9, &dropped);
  EXPECT_EQ(d, b) << "the oldest unclaimed one";
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(s.find(0, 1), a);
  EXPECT_TRUE(a->claimed);
  // d in flight, a claimed, c finished: c goes.
  EXPECT_EQ(s.take(1, 10, &dropped), c);
  // Now d and c in flight, a claimed.
  dropped = 99;
  EXPECT_EQ(s.take(1, 11, &dropped), nullptr);
  land(d);
  land(c);
  c->claimed = true;
  d->claimed = true;
  EXPECT_EQ(s.take(1, 11, &dropped), nullptr) << "every buffer claimed";
  EXPECT_EQ(s.find(0, 1), a);
  EXPECT_EQ(s.find(1, 9), d);
  EXPECT_EQ(s.find(1, 10), c);
  // The claim ends (a promotion done): the buffer is freed, and taken first.
  s.free(c);
  EXPECT_FALSE(c->claimed);
  EXPECT_EQ(s.take(2, 12, &dropped), c);
  EXPECT_EQ(dropped, -1);
}

// ---- the expert store with prefetch on ----------------------------------------------------

// One synthesized `tiny` engine directory (4 MoE layers of 32 experts, top-4) for the tests
// that do not damage it.
const std::string& tiny_dir() {
  static const std::string dir = test::synth_tiny("prefetch-store", 11);
  return dir;
}

StoreOptions store_options(IoKind io, PrefetchMode mode, int slots, int staging, int width, bool verify = true,
                           PolicyKind policy = PolicyKind::LRU) {
  StoreOptions o{.slots = slots, .policy = policy, .io = io, .verify = verify, .top_k = 4};
  o.prefetch.mode = mode;
  o.prefetch.staging = staging;
  o.prefetch.width = width;
  return o;
}

// Prefetch reads land in the background; the tests that need them landed (a buffer is dropped
// only once its read finished) wait for the engine's completed bytes, then a moment for the
// completion to be published.
void wait_for_bytes(const ExpertStore& s, uint64_t bytes) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (s.io_counters().bytes < bytes) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "reads did not land: " << s.io_counters().bytes << " of " << bytes;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// Acquires `experts` of `layer` in both stores, expects byte-identical records, releases.
void acquire_both(ExpertStore& on, ExpertStore& off, int layer, const std::vector<int>& experts) {
  const size_t rec = on.index().layers[size_t(layer)].record_bytes;
  const std::vector<const uint8_t*> a = on.acquire(layer, experts);
  const std::vector<const uint8_t*> b = off.acquire(layer, experts);
  ASSERT_EQ(a.size(), experts.size());
  for (size_t i = 0; i < experts.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i], b[i], rec), 0) << "layer " << layer << ", expert " << experts[i];
  on.release(layer);
  off.release(layer);
}

// The pools of both stores: the same hits, misses, evictions and residents, layer by layer.
void expect_same_pools(const ExpertStore& on, const ExpertStore& off) {
  const std::vector<LayerStats> a = on.stats(), b = off.stats();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].name);
    EXPECT_EQ(a[i].pool.hits, b[i].pool.hits);
    EXPECT_EQ(a[i].pool.misses, b[i].pool.misses);
    EXPECT_EQ(a[i].pool.evictions, b[i].pool.evictions);
    EXPECT_EQ(a[i].resident, b[i].resident);
  }
}

PrefetchStats prefetch_total(const ExpertStore& s) {
  PrefetchStats p;
  for (const LayerStats& l : s.stats()) p += l.prefetch;
  return p;
}
PoolStats pool_total(const ExpertStore& s) {
  PoolStats p;
  for (const LayerStats& l : s.stats()) p += l.pool;
  return p;
}

TEST(ExpertStorePrefetch, OffAutoAndOnDecideWhetherItRuns) {
  const std::string& dir = tiny_dir();
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  EXPECT_FALSE(ExpertStore(dir, index, store_options(IoKind::Pread, PrefetchMode::Off, 6, 0, 0)).prefetching());
  EXPECT_TRUE(ExpertStore(dir, index, store_options(IoKind::Pread, PrefetchMode::Auto, 6, 0, 0)).prefetching());
  EXPECT_FALSE(ExpertStore(dir, index, store_options(IoKind::Pread, PrefetchMode::Auto, 0, 0, 0)).prefetching())
      << "auto: every expert resident, nothing to prefetch";
  ExpertStore on(dir, index, store_options(IoKind::Pread, PrefetchMode::On, 0, 0, 0));
  EXPECT_TRUE(on.prefetching());
  EXPECT_EQ(on.staging_buffers(), 2 * max_prefetch_width(4));
  size_t widest = 0;
  for (const ExpertLayer& l : index.layers) widest = std::max(widest, l.stride);
  EXPECT_EQ(on.staging_bytes(), size_t(on.staging_buffers()) * widest);
  EXPECT_EQ(on.prefetch_width(), 4) << "adaptive: starts at top_k";
  // One layer ahead: layer L's experts predicted from layer L - 1; layer 0 from none.
  for (int source = 0; source < 3; ++source)
    EXPECT_EQ(on.prefetch_targets(source), std::vector<int>{on.layer_of("model.layers." + std::to_string(source + 1) + ".mlp")});
  EXPECT_TRUE(on.prefetch_targets(3).empty());
  EXPECT_TRUE(on.prefetch_targets(-1).empty());
  // Two ahead below layer 2, one from it: layers 0 and 1 have no layer two before them, layer 2
  // is predicted from 1, layer 3 from 2.
  StoreOptions o = store_options(IoKind::Pread, PrefetchMode::On, 6, 3, 2);
  parse_prefetch_ahead("2,1@2", o.prefetch);
  ExpertStore sched(dir, index, o);
  EXPECT_TRUE(sched.prefetch_targets(0).empty());
  EXPECT_EQ(sched.prefetch_targets(1), std::vector<int>{sched.layer_of("model.layers.2.mlp")});
  EXPECT_EQ(sched.prefetch_targets(2), std::vector<int>{sched.layer_of("model.layers.3.mlp")});
  EXPECT_EQ(sched.prefetch_width(), 2) << "a fixed width";
  EXPECT_EQ(sched.staging_buffers(), 3);
  // Off: prefetch() is a no-op.
  ExpertStore off(dir, index, store_options(IoKind::Pread, PrefetchMode::Off, 6, 0, 0));
  off.prefetch(1, {1, 2, 3});
  EXPECT_EQ(prefetch_total(off).predicted, 0u);
  EXPECT_EQ(off.io_counters().prefetch_reads, 0u);
}

class StorePrefetchIo : public ::testing::TestWithParam<IoKind> {};

TEST_P(StorePrefetchIo, PrefetchedExpertsArePromotedByteIdenticalAndThePoolIsUntouched) {
  const std::string& dir = tiny_dir();
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  ExpertStore on(dir, index, store_options(GetParam(), PrefetchMode::On, 6, 4, 8));
  ExpertStore off(dir, index, store_options(GetParam(), PrefetchMode::Off, 6, 4, 8));
  ASSERT_TRUE(on.prefetching());
  ASSERT_FALSE(off.prefetching());
  const int L1 = on.layer_of("model.layers.1.mlp"), L2 = on.layer_of("model.layers.2.mlp"),
            L3 = on.layer_of("model.layers.3.mlp");
  const uint64_t stride = index.layers[size_t(L1)].stride;

  // Three predicted, two of them routed: those two come from staging, the third routed one is read.
  on.prefetch(L1, {3, 5, 7});
  PrefetchStats p = on.stats()[size_t(L1)].prefetch;
  EXPECT_EQ(p.predicted, 3u);
  EXPECT_EQ(p.issued, 3u);
  EXPECT_EQ(p.bytes, 3 * stride);
  EXPECT_EQ(p.used, 0u);
  acquire_both(on, off, L1, {3, 5, 9});
  p = on.stats()[size_t(L1)].prefetch;
  EXPECT_EQ(p.used, 2u);
  EXPECT_EQ(p.wasted, 0u);
  EXPECT_EQ(on.io_counters().demand_reads, 1u) << "the staged experts needed no demand read";
  EXPECT_EQ(on.io_counters().prefetch_reads, 3u);
  EXPECT_EQ(off.io_counters().demand_reads, 3u);
  expect_same_pools(on, off);

  // Resident (3, 5, 9) and staged (7) experts are not read again.
  const IoCounters before = on.io_counters();
  on.prefetch(L1, {3, 5, 9, 7});
  p = on.stats()[size_t(L1)].prefetch;
  EXPECT_EQ(p.predicted, 7u);
  EXPECT_EQ(p.issued, 3u);
  EXPECT_EQ(p.bytes, 3 * stride);
  EXPECT_EQ(on.io_counters().prefetch_reads, before.prefetch_reads);
  EXPECT_EQ(on.io_counters().demand_reads, before.demand_reads);
  acquire_both(on, off, L1, {7, 3});  // 7 from staging (a miss, as without prefetch), 3 a hit
  EXPECT_EQ(on.stats()[size_t(L1)].prefetch.used, 3u);
  expect_same_pools(on, off);

  // The width caps a prediction: 8 a token (fixed), times the tokens.
  on.prefetch(L3, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 1);
  EXPECT_EQ(on.stats()[size_t(L3)].prefetch.predicted, 8u);
  EXPECT_EQ(on.stats()[size_t(L3)].prefetch.issued, 4u) << "four buffers";
  EXPECT_EQ(on.stats()[size_t(L3)].prefetch.no_buffer, 4u) << "every buffer in flight or holding this prediction";
  acquire_both(on, off, L3, {0, 1, 2, 3});  // all four staged: used, buffers free again
  EXPECT_EQ(on.stats()[size_t(L3)].prefetch.used, 4u);

  // Full staging drops the oldest finished unclaimed experts: counted wasted for their layer.
  // (Nothing is in flight now: every read issued so far was promoted, and acquire waited for it.)
  const uint64_t landed = on.io_counters().bytes;
  on.prefetch(L1, {10, 11, 12, 13});
  wait_for_bytes(on, landed + 4 * stride);
  on.prefetch(L2, {1, 2});
  p = on.stats()[size_t(L1)].prefetch;
  EXPECT_EQ(on.stats()[size_t(L2)].prefetch.issued, 2u);
  EXPECT_EQ(on.stats()[size_t(L2)].prefetch.no_buffer, 0u) << "the landed reads should have been droppable";
  EXPECT_EQ(p.wasted, 2u) << "10 and 11, the oldest";
  EXPECT_EQ(on.stats()[size_t(L2)].prefetch.wasted, 0u);
  acquire_both(on, off, L1, {10, 11, 12, 13});  // 12 and 13 still staged, 10 and 11 read again
  EXPECT_EQ(on.stats()[size_t(L1)].prefetch.used, 3u + 2u);
  expect_same_pools(on, off);

  // Claimed buffers are never dropped: with all four claimed, a prediction finds no buffer.
  on.prefetch(L1, {20, 21});  // staging: L2 {1, 2}, L1 {20, 21}
  {
    Acquired a2 = on.start_acquire(L2, {1, 2});
    Acquired a1 = on.start_acquire(L1, {20, 21});
    on.prefetch(L3, {30});
    EXPECT_EQ(on.stats()[size_t(L3)].prefetch.no_buffer, 4u + 1u);
    EXPECT_EQ(on.stats()[size_t(L3)].prefetch.issued, 4u);
    const std::vector<const uint8_t*> r2 = off.acquire(L2, {1, 2}), r1 = off.acquire(L1, {20, 21});
    std::vector<int> seen;
    for (int i; (i = a2.next()) >= 0;) seen.push_back(i);
    EXPECT_EQ(seen.size(), 2u);
    for (int i; (i = a1.next()) >= 0;) seen.push_back(i);
    EXPECT_EQ(seen.size(), 4u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(std::memcmp(a2.records[i], r2[i], index.layers[size_t(L2)].record_bytes), 0);
      EXPECT_EQ(std::memcmp(a1.records[i], r1[i], index.layers[size_t(L1)].record_bytes), 0);
    }
  }
  on.release(L1), on.release(L2), off.release(L1), off.release(L2);
  EXPECT_EQ(on.stats()[size_t(L2)].prefetch.used, 2u);
  expect_same_pools(on, off);

  // What prefetch saved, in the counters: every miss was a demand read or a promotion.
  const PoolStats pool = pool_total(on);
  const PrefetchStats total = prefetch_total(on);
  EXPECT_EQ(on.io_counters().demand_reads + total.used, pool.misses);
  EXPECT_EQ(off.io_counters().demand_reads, pool_total(off).misses);
  EXPECT_EQ(on.io_counters().prefetch_reads, total.issued);
  EXPECT_EQ(on.io_counters().bytes, (on.io_counters().demand_reads + total.issued) * stride);
  EXPECT_EQ(pool.bytes_read, on.io_counters().demand_reads * stride) << "the pool counts its demand reads only";
}

// Random predictions (some right, most not) before random routed sets, on tiny pools and tiny
// staging, every policy: the records and the pools are exactly those of a store without prefetch.
// next_batch(): the hits come in the first batch, every expert once in all, then nothing; the
// records are the demand path's.
TEST_P(StorePrefetchIo, NextBatchHandsTheHitsFirstAndEveryExpertOnce) {
  const std::string& dir = tiny_dir();
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  const int L = 1;
  ExpertStore store(dir, index, store_options(GetParam(), PrefetchMode::Off, 8, 0, 4));
  ExpertStore ref(dir, index, store_options(GetParam(), PrefetchMode::Off, 8, 0, 4));
  store.acquire(L, {3, 5, 7});
  store.release(L);
  const std::vector<int> experts{5, 0, 3, 1, 7, 2};
  const std::vector<const uint8_t*> want = ref.acquire(L, experts);
  Acquired a = store.start_acquire(L, experts);
  std::vector<int> seen(experts.size(), 0);
  std::vector<int> first = a.next_batch();
  for (int hit : {0, 2, 4}) EXPECT_NE(std::find(first.begin(), first.end(), hit), first.end()) << hit;
  for (std::vector<int> b = first; !b.empty(); b = a.next_batch())
    for (int i : b) {
      ++seen[size_t(i)];
      EXPECT_EQ(0, std::memcmp(a.records[size_t(i)], want[size_t(i)], index.layers[L].stride)) << "expert " << experts[size_t(i)];
    }
  EXPECT_EQ(seen, std::vector<int>(experts.size(), 1));
  EXPECT_TRUE(a.next_batch().empty());
  store.release(L);
}

TEST_P(StorePrefetchIo, RandomPredictionsNeverChangeRecordsOrPools) {
  const std::string& dir = tiny_dir();
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  for (PolicyKind policy : {PolicyKind::LRU, PolicyKind::LFU, PolicyKind::LRFU}) {
    SCOPED_TRACE(policy_name(policy));
    ExpertStore on(dir, index, store_options(GetParam(), PrefetchMode::On, 5, 3, 6, true, policy));
    ExpertStore off(dir, index, store_options(GetParam(), PrefetchMode::Off, 5, 3, 6, true, policy));
    std::mt19937 rng(uint32_t(policy) + 3);
    auto distinct = [&](size_t n, std::vector<int> v) {
      while (v.size() < n)
        if (int e = int(rng() % 32); std::find(v.begin(), v.end(), e) == v.end()) v.push_back(e);
      return v;
    };
    for (int iter = 0; iter < 120; ++iter) {
      const int layer = int(rng() % 4);
      const std::vector<int> routed = distinct(4, {});
      // A prediction ranks some of the routed experts first, then guesses.
      std::vector<int> predicted(routed.begin(), routed.begin() + int(rng() % 3));
      predicted = distinct(6, predicted);
      on.prefetch(layer, predicted, int(rng() % 2) + 1);
      if (rng() % 4 == 0) on.prefetch(int(rng() % 4), distinct(6, {}));  // a prediction for another layer
      acquire_both(on, off, layer, routed);
      if (HasFailure()) return;
    }
    expect_same_pools(on, off);
    const PrefetchStats p = prefetch_total(on);
    EXPECT_GT(p.used, 0u);
    EXPECT_GT(p.issued, p.used);
    EXPECT_EQ(on.io_counters().demand_reads + p.used, pool_total(on).misses);
  }
}

// ---- corrupt records read ahead -----------------------------------------------------------

struct Damage {
  const char* what;
  bool verify;
  int bad;  // the damaged expert of layer 2
};

// A copy of a tiny engine directory with two damaged records in layer 2: expert 4 holds expert
// 3's bytes (its header names expert 3), and expert 6 has one payload byte changed (only its
// checksum tells).
std::string damaged_dir(const std::string& tag) {
  const std::string dir = test::synth_tiny(tag, 11);
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  const ExpertLayer& l = index.layers[2];
  EXPECT_EQ(l.name, "model.layers.2.mlp");
  std::fstream f(dir + "/" + l.file, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<char> rec(l.stride);
  f.seekg(std::streamoff(3 * l.stride));
  f.read(rec.data(), std::streamsize(rec.size()));
  f.seekp(std::streamoff(4 * l.stride));
  f.write(rec.data(), std::streamsize(rec.size()));
  f.seekg(std::streamoff(6 * l.stride + l.record_bytes / 2));
  char c = 0;
  f.get(c);
  f.seekp(std::streamoff(6 * l.stride + l.record_bytes / 2));
  f.put(char(c ^ 0x5a));
  return dir;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class CorruptPrefetch : public ::testing::TestWithParam<std::tuple<IoKind, Damage>> {};

TEST_P(CorruptPrefetch, FailsOnlyWhenAskedForAndExactlyAsADemandRead) {
  const auto [io, damage] = GetParam();
  static const std::string dir = damaged_dir("prefetch-corrupt");
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  const int L = 2, bad = damage.bad;
  ExpertStore on(dir, index, store_options(io, PrefetchMode::On, 6, 4, 8, damage.verify));
  ExpertStore off(dir, index, store_options(io, PrefetchMode::Off, 6, 4, 8, damage.verify));

  const std::string want = error_of([&] { off.acquire(L, {bad}); });
  ASSERT_NE(want, "") << "the damage must fail a demand read";
  EXPECT_NE(want.find("expert " + std::to_string(bad)), std::string::npos) << want;
  EXPECT_NE(want.find(damage.verify ? "checksum" : "holds expert 3"), std::string::npos) << want;

  // Read ahead: nothing fails yet, and a good expert read in the same prediction is fine.
  EXPECT_NO_THROW(on.prefetch(L, {bad, 5, 7}));
  acquire_both(on, off, L, {5});
  EXPECT_EQ(on.stats()[L].prefetch.used, 1u);
  // Asked for: the same error as the demand read, and the expert is not resident.
  EXPECT_EQ(error_of([&] { on.acquire(L, {bad}); }), want);
  EXPECT_EQ(on.stats()[L].prefetch.used, 2u) << "it was promoted from staging";
  EXPECT_EQ(on.stats()[L].resident, 1) << "5 only";
  expect_same_pools(on, off);
  // A retry (a demand read now: the bad record left staging) fails the same way.
  const uint64_t demand = on.io_counters().demand_reads;
  EXPECT_EQ(error_of([&] { on.acquire(L, {bad}); }), want);
  EXPECT_EQ(on.io_counters().demand_reads, demand + 1);
  EXPECT_EQ(error_of([&] { off.acquire(L, {bad}); }), want);
  expect_same_pools(on, off);

  // In a batch with a staged good expert, a demand-read one and a hit: the batch fails as it does
  // without prefetch, leaving the same residents.
  on.prefetch(L, {bad, 9});  // 7 is still staged
  EXPECT_EQ(error_of([&] { on.acquire(L, {5, 7, bad, 9, 11}); }), want);
  EXPECT_EQ(error_of([&] { off.acquire(L, {5, 7, bad, 9, 11}); }), want);
  expect_same_pools(on, off);
  // The good experts acquire and release fine; 9, staged and abandoned by the failed batch, is
  // still staged: promoted now, while 11 is read again.
  const uint64_t used = on.stats()[L].prefetch.used, demand_before = on.io_counters().demand_reads;
  acquire_both(on, off, L, {5, 7, 9, 11});
  EXPECT_EQ(on.stats()[L].prefetch.used, used + 1);
  EXPECT_EQ(on.io_counters().demand_reads, demand_before + 1);
  acquire_both(on, off, L, {12, 13, 14, 15});
  acquire_both(on, off, L + 1, {bad, 1, 2});  // the same expert id in another layer is fine
  expect_same_pools(on, off);
  EXPECT_EQ(error_of([&] { on.acquire(L, {bad, 5}); }), want);
  EXPECT_EQ(error_of([&] { off.acquire(L, {bad, 5}); }), want);
  expect_same_pools(on, off);

  // Read ahead and never asked for: dropped as waste, nothing thrown anywhere. (Every staged
  // expert was promoted or freed by now, and nothing is in flight.)
  EXPECT_EQ(on.stats()[L].prefetch.wasted, 0u);
  const uint64_t landed = on.io_counters().bytes;
  on.prefetch(L, {bad});
  wait_for_bytes(on, landed + index.layers[L].stride);
  EXPECT_NO_THROW(on.prefetch(L + 1, {20, 21, 22, 23}));
  EXPECT_EQ(on.stats()[L].prefetch.wasted, 1u);
  EXPECT_EQ(on.stats()[L + 1].prefetch.no_buffer, 0u);
  acquire_both(on, off, L + 1, {20, 21, 22, 23});
  EXPECT_EQ(error_of([&] { on.acquire(L, {bad}); }), want);
  EXPECT_EQ(error_of([&] { off.acquire(L, {bad}); }), want);
  expect_same_pools(on, off);
}

// start_acquire / next(): the good experts before the bad one are handed over, then the bad one
// throws the demand read's error, and the Acquired leaves nothing held.
TEST_P(CorruptPrefetch, IncrementalAcquireThrowsTheSameErrorAndLeavesThePoolConsistent) {
  const auto [io, damage] = GetParam();
  static const std::string dir = damaged_dir("prefetch-corrupt-next");
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  const int L = 2, bad = damage.bad;
  ExpertStore on(dir, index, store_options(io, PrefetchMode::On, 6, 4, 8, damage.verify));
  ExpertStore off(dir, index, store_options(io, PrefetchMode::Off, 6, 4, 8, damage.verify));
  const std::string want = error_of([&] { off.acquire(L, {bad}); });
  ASSERT_NE(want, "");
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    on.prefetch(L, {bad, 8, 10});
    std::string got;
    int handed = 0;
    {
      Acquired a = on.start_acquire(L, {8, bad, 10});
      try {
        while (a.next() >= 0) ++handed;
      } catch (const Error& e) {
        got = e.what();
      }
    }
    EXPECT_EQ(got, want);
    EXPECT_LE(handed, 2);
    if (round > 0) {
      EXPECT_EQ(handed, 2) << "8 and 10 are hits now: handed over first";
    }
    on.release(L);  // (the failed Acquired released already: a second release is harmless)
    // Nothing stays held: a full pool's worth of good experts fits.
    acquire_both(on, off, L, {8, 10, 12, 13, 14, 15});
  }
}

const Damage kHeader{"header", false, 4};
const Damage kChecksum{"checksum", true, 6};

INSTANTIATE_TEST_SUITE_P(Io, StorePrefetchIo, ::testing::Values(IoKind::Uring, IoKind::Pread),
                         [](const auto& i) { return std::string(i.param == IoKind::Uring ? "uring" : "pread"); });
INSTANTIATE_TEST_SUITE_P(Io, CorruptPrefetch,
                         ::testing::Combine(::testing::Values(IoKind::Uring, IoKind::Pread), ::testing::Values(kHeader, kChecksum)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param) == IoKind::Uring ? "uring_" : "pread_") + std::get<1>(i.param).what;
                         });

}  // namespace
}  // namespace ms
