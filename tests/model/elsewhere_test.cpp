// model/moe.h's ElsewhereExperts, what the CUDA backend's hybrid prefill uses to compute some of
// a prompt chunk's experts on the CPU beside the GPU: a backend that takes every third expert of
// each layer out of the chunk and computes it itself, after the rest are queued, gives the plain
// forward's logits bit for bit. So the experts taken out are neither lost nor run twice, and
// their users' rows land in their slots whatever order they come in.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/load.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/moe.h"

namespace ms {
namespace {

// The CPU backend with every third expert of a chunk computed "elsewhere": by the same kernels,
// one expert at a time from its own acquire of the store, once the layer's others have run.
struct ElsewhereCpu : CpuBackend {
  const ModelWeights* weights = nullptr;
  mutable const float* x = nullptr;  // the chunk's input, as take_elsewhere saw it
  mutable int taken = 0;

  // model/moe.h's, over this backend (the base's runs over CpuBackend's primitives).
  void moe(const ModelConfig& cfg, const FfnWeights& w, const float* in, int T, float* out, int* routes,
           float* router_probs, const int* forced_routes = nullptr) const {
    grouped_moe(*this, cfg, w, in, T, out, routes, router_probs, forced_routes);
  }

  std::vector<int> take_elsewhere(int, const float* chunk_x, int, std::vector<int>& order,
                                  const std::vector<std::vector<int>>&) const {
    std::vector<int> keep, out;
    for (size_t i = 0; i < order.size(); ++i) (i % 3 == 1 ? out : keep).push_back(order[i]);
    order = keep;
    x = chunk_x;
    taken += int(out.size());
    return out;
  }

  void run_elsewhere(int layer, const cpu::ExpertUsers& g, const std::vector<int>& experts,
                     const std::vector<std::vector<int>>& users, float* partial) const {
    const ExpertLayer* layout = nullptr;
    for (const LayerWeights& l : weights->layers)
      if (l.moe && l.ffn.store_layer == layer) layout = l.ffn.record_layout;
    ASSERT_NE(layout, nullptr) << "store layer " << layer;
    const int H = weights->embed.cols;
    for (auto e = experts.rbegin(); e != experts.rend(); ++e) {  // the other order than the chunk's
      const int n = int(users[size_t(*e)].size());
      std::vector<float> xb(size_t(n) * size_t(H)), yb(xb.size());
      const std::vector<const uint8_t*> record = this->experts->acquire(layer, {*e});
      gather_users(g, *e, x, H, xb.data());
      mlp(expert_weights(*layout, record[0]), xb.data(), n, yb.data());
      this->experts->release(layer);
      scatter_users(g, *e, yb.data(), H, partial);
    }
  }
};
static_assert(ElsewhereExperts<ElsewhereCpu>);
static_assert(!ElsewhereExperts<CpuBackend>);

TEST(ElsewhereExperts, TakenOutAndRunAfterTheRestTheyGiveThePlainForwardsBits) {
  const std::string dir = std::string(MOESTREAM_SOURCE_DIR) + "/models/pycoder-moe-q4";
  const auto model = load_model(dir);
  std::vector<int> prompt;
  for (int t = 0; t < 48; ++t) prompt.push_back((t * 977 + 13) % 8192);
  const int T = int(prompt.size());
  ForwardOptions opt;
  opt.all_logits = true;

  State plain_state = model->new_state();
  const CpuBackend plain{plain_state, model->experts()};
  const std::vector<float> want = Forward(model->config(), model->weights(), plain).run(prompt.data(), T, 0, opt).logits;

  State state = model->new_state();
  ElsewhereCpu be{{state, model->experts()}, &model->weights()};
  const std::vector<float> got = Forward(model->config(), model->weights(), be).run(prompt.data(), T, 0, opt).logits;

  EXPECT_GT(be.taken, 0);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "logit " << i;
}

}  // namespace
}  // namespace ms
