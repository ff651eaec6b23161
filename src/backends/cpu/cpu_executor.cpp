#include "backends/cpu/cpu_executor.h"

#include <fmt/format.h>

#include "backends/cpu/cpu_backend.h"
#include "kernels/cpu/quant_matmul.h"
#include "model/forward.h"
#include "model/moe.h"

namespace ms {

static_assert(Backend<CpuBackend>);
static_assert(GroupedMoe<CpuBackend>);

void CpuBackend::moe(const ModelConfig& cfg, const FfnWeights& w, const float* x, int T, float* out, int* routes,
                     float* router_probs, const int* forced_routes) const {
  grouped_moe(*this, cfg, w, x, T, out, routes, router_probs, forced_routes);
}

void CpuBackend::mlps(const std::vector<MlpCall>& calls) const {
  for (const MlpCall& c : calls)
    for (const Mat* m : {&c.w.gate, &c.w.up, &c.w.down})
      if (m->type != WeightType::Affine) {
        for (const MlpCall& one : calls) mlp(one.w, one.x, one.n, one.y);
        return;
      }
  std::vector<Buf> h(calls.size()), u(calls.size());
  std::vector<cpu::QuantJob> jobs;
  for (size_t i = 0; i < calls.size(); ++i) {
    const MlpCall& c = calls[i];
    h[i].resize(size_t(c.n) * size_t(c.w.gate.rows));
    u[i].resize(h[i].size());
    jobs.push_back({c.x, c.n, c.w.gate.quant(), h[i].data()});
    jobs.push_back({c.x, c.n, c.w.up.quant(), u[i].data()});
  }
  cpu::matmul_quant_batch(jobs.data(), jobs.size());
  jobs.clear();
  for (size_t i = 0; i < calls.size(); ++i) {
    cpu::silu_mul(h[i].data(), u[i].data(), h[i].data(), int64_t(h[i].size()));
    jobs.push_back({h[i].data(), calls[i].n, calls[i].w.down.quant(), calls[i].y});
  }
  cpu::matmul_quant_batch(jobs.data(), jobs.size());
}

int CpuBackend::pick(const float* logits, int vocab, const PickInputs& in) const {
  thread_local cpu::SampleScratch scratch;  // a pick's vocabulary-sized buffers, kept between picks
  return cpu::sample(logits, vocab, in, scratch);
}

namespace {

class CpuExecutor final : public Executor {
 public:
  explicit CpuExecutor(const Model& m) : m_(m) {}

  Device device() const override { return Device::Cpu; }

  ForwardResult forward(const int* ids, int T, State& state, const ForwardOptions& opt) const override {
    const CpuBackend be{state, m_.experts()};
    if (opt.verify) state.begin_steps(T);
    return Forward(m_.config(), m_.weights(), be).run(ids, T, state.position(), opt);
  }

  // One forward a step: the CPU has nothing to overlap between steps.
  int decode(State& state, int first, int max_steps, const DecodeOptions& opt, const OnStep& on_step) const override {
    return decode_stepwise(state, first, max_steps, opt, on_step);
  }

  std::vector<float> mtp(const float* hidden, const int* next_ids, int T, int pos0, State& state,
                         std::vector<float>* hidden_out, int logit_rows) const override {
    const CpuBackend be{state, m_.experts()};
    return Forward(m_.config(), m_.weights(), be).mtp(hidden, next_ids, T, pos0, hidden_out, logit_rows);
  }

  std::vector<LayerStats> pool_stats() const override {
    return m_.experts() ? m_.experts()->stats() : std::vector<LayerStats>{};
  }
  size_t pool_bytes() const override { return m_.experts() ? m_.experts()->resident_bytes() : 0; }
  std::vector<PoolTier> pool_tiers() const override {
    const ExpertStore* store = m_.experts();
    if (!store) return {};
    const TierLoad load = m_.warm_report().tier_load();
    return {{fmt::format("expert pool ({}, {} MiB resident)", store->io_description(), store->resident_bytes() >> 20),
             store->stats(), "read", "ram", load.measured_read_gb_s(), load}};
  }

 private:
  const Model& m_;
};

}  // namespace

std::unique_ptr<Executor> make_cpu_executor(const Model& model) { return std::make_unique<CpuExecutor>(model); }

}  // namespace ms
