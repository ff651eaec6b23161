// The KV cache's formats (--kv-bits, quant/kv_quant.h) in the whole forward of the trained
// pycoder-moe (../shared/models/pycoder-moe): bf16 stays within its rounding of float32, a
// packed cache keeps the engine's bit promises (a prompt's rows are one-token steps' bits,
// speculative greedy is plain greedy), and the quality gates of quantized settings against
// float32 KV over held-out documents at 4096 tokens of context.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/load.h"
#include "model/model.h"
#include "model/plan.h"
#include "runtime/generate.h"
#include "pycoder_fixture.h"
#include "test_support.h"

namespace ms {
namespace {

using test::ints;

KvFormat format(int k_bits, int v_bits, KvRotation rotation = KvRotation::Hadamard, int group = 64) {
  KvFormat f;
  f.k = {k_bits, group};
  f.v = {v_bits, group};
  f.rotation = rotation;
  return f;
}

class KvCache : public test::PycoderSuite {
 protected:
  State state(const KvFormat& f) const { return State(model_->config(), 0, f); }
};

// bf16 keys and values (8 significant bits: each off by up to 2^-9 of itself) move the median
// position's largest logit change by under 0.05 over doc5 (measured 0.012, logits up to ~19).
// Where the change crosses a router's near-tie a routed set changes and a logit can move by ~0.5
// (measured 0.52 at one of doc5's 128 positions), so the bound is on the median; the greedy
// pick agrees at every position.
TEST_F(KvCache, Bf16StaysWithinItsRounding) {
  const std::vector<int> ids = ints(ref_->get("doc5.input_ids"));
  const int T = int(ids.size());
  const size_t V = size_t(model_->config().vocab);
  State exact = state({}), bf16 = state(format(16, 16));
  const ForwardResult a = model_->forward(ids.data(), T, exact, {.all_logits = true});
  const ForwardResult b = model_->forward(ids.data(), T, bf16, {.all_logits = true});
  std::vector<float> moves;
  for (int t = 0; t < T; ++t) {
    const float* x = a.logits.data() + size_t(t) * V;
    const float* y = b.logits.data() + size_t(t) * V;
    float m = 0;
    for (size_t i = 0; i < V; ++i) m = std::max(m, std::abs(x[i] - y[i]));
    moves.push_back(m);
    EXPECT_EQ(std::max_element(x, x + V) - x, std::max_element(y, y + V) - y) << "position " << t;
  }
  std::sort(moves.begin(), moves.end());
  std::printf("bf16 KV against float32 KV over doc5: largest logit change median %.3g, max %.3g\n", moves[moves.size() / 2],
              moves.back());
  EXPECT_LE(moves[moves.size() / 2], 0.05f);
  EXPECT_GT(moves.back(), 0.f);  // the cache did hold bf16
}

// Over a packed cache the rows of a speculative verification (ForwardOptions::verify) are the bits
// of the same tokens run one at a time: each token attends to quantized rows either way.
TEST_F(KvCache, PackedVerifyRowsAreOneTokenStepsBits) {
  const std::vector<int> ids = ints(ref_->get("doc5.input_ids"));
  const int T = 40;
  for (const KvFormat& f : {format(4, 3), format(8, 4, KvRotation::So4), format(4, 4, KvRotation::None)}) {
    State whole = state(f), steps = state(f);
    const ForwardResult all = model_->forward(ids.data(), T, whole, {.all_logits = true, .verify = true});
    const size_t V = size_t(model_->config().vocab);
    for (int t = 0; t < T; ++t) {
      const ForwardResult one = model_->forward(ids.data() + t, 1, steps, {});
      ASSERT_TRUE(std::equal(one.logits.begin(), one.logits.end(), all.logits.begin() + long(size_t(t) * V)))
          << f.describe() << " token " << t;
    }
  }
}

// Speculative greedy over a packed cache is plain greedy over it, drafts of 1 and 3.
TEST_F(KvCache, SpeculativeGreedyOverAPackedCacheIsPlainGreedy) {
  ASSERT_TRUE(model_->has_mtp());
  for (const char* p : {"prompt0", "prompt1"}) {
    const std::vector<int> prompt = ints(ref_->get(std::string(p) + ".input_ids"));
    State plain_state = state(format(4, 3));
    const std::vector<int> plain =
        generate_greedy(*model_, plain_state, prompt, {.max_tokens = 48, .stop_at_eos = false});
    for (const int draft : {1, 3}) {
      State s = state(format(4, 3));
      const std::vector<int> spec = generate_greedy(
          *model_, s, prompt, {.max_tokens = 48, .stop_at_eos = false, .speculative = {.mtp = true, .draft = draft}});
      EXPECT_EQ(spec, plain) << p << " draft " << draft;
    }
  }
}

// Streaming experts through a small pool over a packed cache gives the resident run's bits
// (the embedded pycoder-moe-q4 engine directory, 16 slots a layer of 128).
TEST(KvCacheStreaming, APackedCacheStreamsBitIdentically) {
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  ModelOptions resident, streamed;
  resident.kv = streamed.kv = format(4, 3);
  streamed.experts.slots = 16;
  const auto a = load_model(dir, resident), b = load_model(dir, streamed);
  std::vector<int> ids;
  for (int i = 0; i < 200; ++i) ids.push_back((i * 37 + 11) % a->config().vocab);
  State sa = a->new_state(), sb = b->new_state();
  EXPECT_EQ(sa.kv_format().describe(), "K4/V3 g64 hadamard");
  const ForwardResult ra = a->forward(ids.data(), int(ids.size()), sa, {.all_logits = true});
  const ForwardResult rb = b->forward(ids.data(), int(ids.size()), sb, {.all_logits = true});
  EXPECT_EQ(ra.logits, rb.logits);
  EXPECT_EQ(generate_greedy(*a, sa, {5}, {.max_tokens = 32, .stop_at_eos = false}),
            generate_greedy(*b, sb, {5}, {.max_tokens = 32, .stop_at_eos = false}));
}

// The memory plan counts the chosen format's bytes a position, and a state's caches hold them.
TEST_F(KvCache, ThePlanAndTheStateCountTheFormatsBytes) {
  const ModelConfig& c = model_->config();
  const KvFormat f = format(4, 3);
  const uint64_t per = f.bytes_per_position(c.n_kv_heads, c.head_dim);  // one layer
  EXPECT_EQ(per, uint64_t(c.n_kv_heads) * ((64 / 2 + 4) + (64 * 3 / 8 + 4)));
  EXPECT_EQ(model_->kv_bytes_per_position(&f), 3 * per);  // two attention layers and the MTP head's
  State s = state(f);
  const std::vector<int> ids = ints(ref_->get("doc5.input_ids"));
  model_->forward(ids.data(), 100, s, {});
  EXPECT_EQ(s.kv_bytes(), 2 * per * uint64_t(s.kv(3).capacity()));  // the MTP cache has not run
  EXPECT_GE(s.kv(3).capacity(), 100);
}

// Mean logits cosine and greedy top-1 agreement against float32 KV over `ids`, teacher-forced,
// each setting's state run chunk by chunk beside the float32 one's.
struct Quality {
  double cosine = 0, agreement = 0, tail_cosine = 0, tail_agreement = 0;  // tail: the last quarter
};

std::vector<Quality> quality(const Model& m, const std::vector<int>& ids, const std::vector<KvFormat>& formats) {
  const size_t V = size_t(m.config().vocab), n = ids.size(), tail = n - n / 4;
  State exact(m.config());
  std::vector<State> states;
  for (const KvFormat& f : formats) states.emplace_back(m.config(), 0, f);
  std::vector<Quality> q(formats.size());
  const int chunk = 512;
  for (size_t at = 0; at < n; at += chunk) {
    const int T = int(std::min<size_t>(chunk, n - at));
    const ForwardResult want = m.forward(ids.data() + at, T, exact, {.all_logits = true});
    for (size_t f = 0; f < formats.size(); ++f) {
      const ForwardResult got = m.forward(ids.data() + at, T, states[f], {.all_logits = true});
      for (int t = 0; t < T; ++t) {
        const float* a = want.logits.data() + size_t(t) * V;
        const float* b = got.logits.data() + size_t(t) * V;
        double ab = 0, aa = 0, bb = 0;
        for (size_t i = 0; i < V; ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
        const double cos = ab / std::sqrt(aa * bb);
        const bool same = std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
        q[f].cosine += cos, q[f].agreement += same;
        if (at + size_t(t) >= tail) q[f].tail_cosine += cos, q[f].tail_agreement += same;
      }
    }
  }
  for (Quality& x : q) {
    x.cosine /= double(n), x.agreement /= double(n);
    x.tail_cosine /= double(n - tail), x.tail_agreement /= double(n - tail);
  }
  return q;
}

// The gates of the issue: over 4096 tokens of held-out documents (doc0 then doc1; all 24 in
// windows of 4096 with MOESTREAM_FULL_KV_GATES=1), K4/V3 with a rotation keeps a mean logits
// cosine of 0.99 and greedy agreement of 95 % against float32 KV. Hadamard (the default) beats no
// rotation on both; so4's blocks of 4 only match it on this model (head_dim 64, one group a
// head): its cosine is higher by 4e-5 and its agreement lower (docs/kv_cache.md).
TEST_F(KvCache, QuantizedSettingsPassTheQualityGates) {
  std::vector<std::vector<int>> windows;
  std::vector<int> all;
  const int docs = std::getenv("MOESTREAM_FULL_KV_GATES") ? 24 : 2;
  for (int d = 0; d < docs; ++d) {
    const std::vector<int> t = ints(routes_->get("doc" + std::to_string(d) + ".tokens"));
    all.insert(all.end(), t.begin(), t.end());
  }
  for (size_t at = 0; at + 4096 <= all.size(); at += 4096) windows.emplace_back(all.begin() + long(at), all.begin() + long(at + 4096));
  const std::vector<KvFormat> formats = {format(16, 16), format(8, 8), format(4, 4), format(4, 3, KvRotation::None),
                                         format(4, 3, KvRotation::So4), format(4, 3, KvRotation::Hadamard)};
  std::vector<Quality> mean(formats.size());
  for (const auto& w : windows) {
    const std::vector<Quality> q = quality(*model_, w, formats);
    for (size_t f = 0; f < q.size(); ++f) {
      mean[f].cosine += q[f].cosine / double(windows.size());
      mean[f].agreement += q[f].agreement / double(windows.size());
      mean[f].tail_cosine += q[f].tail_cosine / double(windows.size());
      mean[f].tail_agreement += q[f].tail_agreement / double(windows.size());
    }
  }
  std::printf("%-20s %10s %10s %14s %14s   (%zu windows of 4096 tokens)\n", "KV cache", "cosine", "top-1", "last-1k cosine",
              "last-1k top-1", windows.size());
  for (size_t f = 0; f < formats.size(); ++f)
    std::printf("%-20s %10.5f %10.4f %14.5f %14.4f\n", formats[f].describe().c_str(), mean[f].cosine, mean[f].agreement,
                mean[f].tail_cosine, mean[f].tail_agreement);
  const Quality &none = mean[3], &so4 = mean[4], &hadamard = mean[5];
  for (const Quality* q : {&so4, &hadamard}) {
    EXPECT_GE(q->cosine, 0.99);
    EXPECT_GE(q->agreement, 0.95);
    EXPECT_GT(q->cosine, none.cosine);
  }
  EXPECT_GT(hadamard.agreement, none.agreement);
  EXPECT_GT(mean[0].cosine, 0.9999);  // bf16
}

}  // namespace
}  // namespace ms
