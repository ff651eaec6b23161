#include "backends/cuda/cuda_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/hybrid.h"
#include "kernels/cuda/device.h"
#include "model/forward.h"
#include "model/moe.h"
#include "util/error.h"

namespace ms {

static_assert(Backend<CudaBackend>);
static_assert(GroupedMoe<CudaBackend>);

bool cuda_backend_available() { return cuda::cuda_available(); }

namespace {

// What a load without --vram plans with: 90 % of the free VRAM (the unsized pools, the embedding).
uint64_t usable_free_vram() { return cuda::free_memory() / 10 * 9; }

// Positions a captured step at pos0 makes its KV caches hold: 512 past it, since each growth
// moves the caches and so costs a capture, but no more than the planned context while pos0 is
// within it (kv_capacity).
int decode_kv_positions(int pos0, int planned) {
  constexpr int kRoom = 512;
  return pos0 < planned ? std::min(pos0 + kRoom, planned) : pos0 + kRoom;
}

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(Model& m, const std::string& dir, const ModelOptions& opt)
      : m_(m), cfg_(m.config()), w_(m.weights()), weights_(std::make_shared<DeviceWeights>(m.weights())) {
    if (ExpertStore* host = m.experts()) {
      MemoryPlan plan = m.memory_plan();
      const StoreOptions vram =
          vram_store_options(dir, cfg_, host->index(), weights_->bytes(), usable_free_vram(), opt, plan);
      m.set_memory_plan(plan);
      pool_ = std::make_unique<DeviceExpertStore>(*host, vram);
      setup_hybrid(opt.cpu_experts);
      // The pools that stream start from the usage history's hottest experts (--warm-start).
      if (pool_->streams())
        pool_->warm(m.warm_set([&](int l) { return pool_->free_capacity(l); }, opt), opt.warm_start == WarmStart::Pin);
    } else if (opt.vram_budget) {
      m.set_memory_plan(plan_checkpoint(dir, cfg_, weights_->bytes(), opt.vram_budget, opt, "VRAM budget"));
    }
    graphs_ = opt.cuda_graphs && every_expert_resident();
    // Only decode ahead reads the embedding on the GPU, so it takes VRAM only where decode steps
    // are graphs, out of what the pools left: the budget's rest, or free VRAM as an unsized pool takes.
    if (graphs_) {
      const uint64_t planned = m.memory_plan().total();
      const uint64_t room = opt.vram_budget ? opt.vram_budget - std::min(opt.vram_budget, planned) : usable_free_vram();
      weights_->add_embedding(w_.embed, room);
    }
  }

  Device device() const override { return Device::Cuda; }

  ForwardResult forward(const int* ids, int T, State& state, const ForwardOptions& opt) const override {
    if (opt.verify) fail("speculative decoding does not run on the GPU yet: use --speculative off with --device cuda");
    const CudaBackend be = backend(state);
    if (T == 1 && graphs_ && opt.logits && !opt.routes_from) return forward_captured(be, ids[0], state.position(), opt);
    return Forward(cfg_, w_, be).run(ids, T, state.position(), opt);
  }

  int decode(State& state, int first, int max_steps, const DecodeOptions& opt, const OnStep& on_step) const override {
    if (opt.greedy && decodes_ahead()) return decode_ahead(state, first, max_steps, opt.routes, on_step);
    return decode_stepwise(state, first, max_steps, opt, on_step);  // each step a replayed graph where graphs_
  }

  std::vector<float> mtp(const float* hidden, const int* next_ids, int T, int pos0, State& state,
                         std::vector<float>* hidden_out, int logit_rows) const override {
    return Forward(cfg_, w_, backend(state)).mtp(hidden, next_ids, T, pos0, hidden_out, logit_rows);
  }

  // The VRAM pool's: every engine directory has one here, and a checkpoint streams nothing.
  std::vector<LayerStats> pool_stats() const override { return pool_ ? pool_->stats() : std::vector<LayerStats>{}; }
  size_t pool_bytes() const override { return pool_ ? pool_->resident_bytes() : 0; }
  std::vector<PoolTier> pool_tiers() const override {
    const ExpertStore* host = m_.experts();
    if (!pool_ || !host) return {};
    const TierLoad host_load = m_.warm_report().tier_load();
    return {{fmt::format("VRAM expert pool ({} MiB; misses come from the host tier by the copy stream)",
                         pool_->resident_bytes() >> 20),
             pool_->stats(), "copy", "vram", pool_->measured_h2d_gb_s(), pool_->load(), placement()},
            {fmt::format("host tier ({}, {} MiB of pinned slots, {})", host->io_description(), host->resident_bytes() >> 20,
                         host->caches() ? "a cache" : "staging only"),
             host->stats(), "read", "host", host_load.measured_read_gb_s(), host_load}};
  }

  // Where a decode token's VRAM misses run, for --stats and /api/stats.
  std::string placement() const {
    if (hybrid_) return hybrid_->describe();
    return hybrid_off_.empty() ? describe(CpuExperts{.mode = CpuExperts::Mode::Off}) : "off: " + hybrid_off_;
  }

  const DeviceExpertStore* vram_pool() const { return pool_.get(); }
  bool decode_graphs() const { return graphs_; }
  // Greedy steps run ahead of the host where steps are graphs and the embedding is in VRAM.
  bool decodes_ahead() const { return graphs_ && weights_->has(w_.embed); }

 private:
  CudaBackend backend(State& state) const {
    return {*weights_, DeviceState::of(state, cfg_), pool_.get(), nullptr, hybrid_.get()};
  }

  // The hybrid decode where --cpu-experts is not off and every layer's experts have the integer
  // product's layout; else every miss is copied (--cpu-experts N then fails, naming the layout).
  void setup_hybrid(const CpuExperts& mode) {
    if (mode.mode == CpuExperts::Mode::Off) return;
    cuda::RecordMat first[3] = {};
    for (size_t i = 0; i < pool_->index().layers.size(); ++i) {
      const ExpertLayer& l = pool_->index().layers[i];
      cuda::RecordMat proj[3];
      for (int m = 0; m < 3; ++m) proj[m] = record_mat(l.proj[size_t(m)]);
      if (!hybrid_layout(proj)) {
        hybrid_off_ = fmt::format("{}'s experts ({}-bit group {} {}) have no integer kernel", l.name, proj[0].bits,
                                  proj[0].group, scale_type_name(proj[0].scale_type));
        if (mode.mode == CpuExperts::Mode::Layers)
          fail("--cpu-experts {}: {}; the CPU computes 4- or 8-bit experts in groups of 32 to 128 (give --cpu-experts "
               "off)",
               mode.layers, hybrid_off_);
        return;
      }
      if (i == 0) std::copy(proj, proj + 3, first);
    }
    hybrid_ = std::make_unique<HybridExperts>(*pool_, mode, first, cfg_.top_k, pool_->streams());
    // Predicted experts the CPU is to compute stay in host memory rather than take PCIe time.
    pool_->set_copy_share([h = hybrid_.get()](int layer, const std::vector<int>& misses, int resident) {
      return h->copy_share(layer, misses, resident);
    });
  }

  // Whether a decode step's MoE layers all route on the GPU to resident experts (moe_decode with
  // a table), so that the step reads nothing back before its logits.
  bool every_expert_resident() const {
    for (const LayerWeights& lw : w_.layers)
      if (lw.moe && (!pool_ || lw.ffn.store_layer < 0 || !pool_->resident_table(lw.ffn.store_layer))) return false;
    return true;
  }

  // The KV caches' addresses for a decode step at pos0, each grown first where it must be.
  std::vector<const void*> decode_step_kv(DeviceState& ds, int pos0) const {
    std::vector<const void*> kv;
    for (int l = 0; l < cfg_.n_layers; ++l)
      if (cfg_.layer_types[size_t(l)] == LayerType::FullAttention) {
        DeviceKV& c = ds.kv[size_t(l)];
        c.reserve(decode_kv_positions(pos0, c.planned));
        c.length = pos0 + 1;
        kv.push_back(c.k.data());
        kv.push_back(c.v.data());
      }
    return kv;
  }

  // Captures the sequence's decode step anew unless its graph is of this kind and holds kv.
  void capture_if_stale(const CudaBackend& be, int pos0, std::vector<const void*> kv, StepKind kind) const {
    DeviceState& ds = be.state;
    if (ds.decode_graph && ds.decode_graph->fits(kind, kv)) return;
    ds.decode_graph.reset();  // its arena back before the new capture takes one
    ds.decode_graph = capture_decode_step(be, pos0, std::move(kv), kind);
  }

  // A decode step (one token) as the sequence's CUDA graph, captured first where there is none
  // yet or the KV caches it holds have moved.
  ForwardResult forward_captured(const CudaBackend& be, int id, int pos0, const ForwardOptions& opt) const {
    const int H = cfg_.hidden;
    DeviceState& ds = be.state;
    capture_if_stale(be, pos0, decode_step_kv(ds, pos0), StepKind::HostInput);
    const DecodeGraph& g = *ds.decode_graph;

    std::vector<float> input(size_t(H) + 1);
    embed_tokens(cfg_, w_, &id, 1, input.data());
    std::memcpy(input.data() + H, &pos0, sizeof(int));
    cuda::copy_to_device_async(g.input.data(), input.data(), input.size() * sizeof(float));
    g.graph.launch();

    ForwardResult r;
    if (opt.pick) r.token = be.pick(g.logits.data(), cfg_.vocab, opt.pick());
    if (!opt.pick || opt.all_logits) r.logits = g.logits.to_vector();
    if (opt.routes) {  // what the step's route_topk wrote to ds.route_ids and route_probs (moe_decode)
      const Forward<CudaBackend> f(cfg_, w_, be);
      r.routes.resize(size_t(cfg_.n_layers));
      r.router_probs.resize(size_t(cfg_.n_layers));
      for (int l = 0; l < cfg_.n_layers; ++l)
        if (const auto [ids, probs] = f.route_rows(r, l, 1); ids)
          be.pending_routes.push_back({ids, probs, w_.layers[size_t(l)].ffn.store_layer});
      be.finish();
    }
    if (opt.hidden) {
      r.hidden_pre_norm.resize(size_t(H));
      cuda::copy_to_host(r.hidden_pre_norm.data(), g.input.data(), size_t(H) * sizeof(float));
      r.hidden_post_norm = g.normed.to_vector();
    }
    return r;
  }

  std::unique_ptr<DecodeGraph> capture_decode_step(const CudaBackend& be, int pos0, std::vector<const void*> kv_at_capture,
                                                   StepKind kind) const {
    auto g = std::make_unique<DecodeGraph>();
    g->input = cuda::DeviceArray<float>(size_t(cfg_.hidden) + 1);
    g->normed = cuda::DeviceArray<float>(size_t(cfg_.hidden));
    g->logits = cuda::DeviceArray<float>(size_t(cfg_.vocab));
    g->kv_at_capture = std::move(kv_at_capture);
    g->kind = kind;
    DeviceState& ds = be.state;
    const bool ahead = kind != StepKind::HostInput, routes = kind == StepKind::AheadWithRoutes;
    if (ahead) {
      g->token = cuda::DeviceArray<int>(1);
      cuda::fit_workspace(g->sampler, cfg_.vocab);
      if (!ds.decode_ring) ds.decode_ring = std::make_unique<cuda::MappedInts>(DeviceState::kDecodeRing);
    }
    if (routes && !ds.decode_route_ring)
      ds.decode_route_ring = std::make_unique<cuda::MappedInts>(DeviceState::kDecodeRing * ds.route_ids.size());
    const CudaBackend step{be.weights, be.state, be.experts, g->position(), be.hybrid};
    const Forward<CudaBackend> f(cfg_, w_, step);
    {
      cuda::ArenaScope scope(g->arena);
      g->graph.begin_capture();
      try {
        if (ahead) cuda::embed_row(step.mat(w_.embed), g->token.data(), g->input.data());
        ForwardResult unused;  // the routes go to ds.route_ids and route_probs, whence forward_captured reads them
        f.layers(g->input.data(), g->normed.data(), 1, pos0, false, unused);
        f.final_logits(g->normed.data(), 1, 1, g->logits.data());
        if (ahead) {
          cuda::greedy_token(g->logits.data(), cfg_.vocab, g->sampler, g->token.data());
          cuda::finish_decode_step(g->token.data(), g->position(), ds.decode_ring->device(), DeviceState::kDecodeRing,
                                   ds.route_ids.data(), routes ? int(ds.route_ids.size()) : 0,
                                   routes ? ds.decode_route_ring->device() : nullptr);
        }
      } catch (...) {
        g->graph.abort_capture();
        throw;
      }
      g->graph.end_capture();
    }
    if (g->arena.lent() != 0)
      fail("a captured decode step kept {} of its activation buffers past its end; the graph would share them", g->arena.lent());
    return g;
  }

  // Greedy decode steps, each launched before the host reads the token of the one before, so
  // that the GPU never waits for the host between steps; decode()'s contract, with the step
  // after the one on_step refuses run by then (the state has processed it too).
  int decode_ahead(State& state, int first, int max_steps, bool routes, const OnStep& on_step) const {
    const CudaBackend be = backend(state);
    DeviceState& ds = be.state;
    const StepKind kind = routes ? StepKind::AheadWithRoutes : StepKind::Ahead;
    const int pos0 = state.position();
    auto slot = [&](int step) { return size_t((pos0 + step) % DeviceState::kDecodeRing); };
    cuda::ComputeMark done[2];  // step s's, in done[s % 2]: at most two steps are queued
    auto launch = [&](int step) {
      const int pos = pos0 + step;
      std::vector<const void*> kv = decode_step_kv(ds, pos);
      if (step == 0 || !ds.decode_graph || !ds.decode_graph->fits(kind, kv)) {
        // A graph made now starts from the host's token and position: the step before's must be
        // done, its token read, and its graph no longer running.
        if (step > 0) done[(step - 1) % 2].wait();
        const int in[2] = {step == 0 ? first : ds.decode_ring->host()[slot(step - 1)], pos};
        capture_if_stale(be, pos, std::move(kv), kind);
        cuda::copy_to_device(ds.decode_graph->token.data(), &in[0], sizeof(int));
        cuda::copy_to_device(ds.decode_graph->position(), &in[1], sizeof(int));
      }
      ds.decode_graph->graph.launch();
      done[step % 2].record();
    };
    // Step s's token, and its routed ids as forward's routes (router_probs stay empty).
    ForwardResult r;
    if (routes) r.routes.resize(size_t(cfg_.n_layers));
    auto result_of = [&](int step) -> const ForwardResult& {
      r.token = ds.decode_ring->host()[slot(step)];
      const size_t n = ds.route_ids.size(), K = size_t(cfg_.top_k);
      for (int l = 0; routes && l < cfg_.n_layers; ++l)
        if (const int layer = w_.layers[size_t(l)].ffn.store_layer; w_.layers[size_t(l)].moe && layer >= 0) {
          const volatile int* ids = ds.decode_route_ring->host() + slot(step) * n + size_t(layer) * K;
          r.routes[size_t(l)].assign(ids, ids + K);
        }
      return r;
    };
    int steps = 0;
    try {
      launch(0), steps = 1;  // a step counts once it is queued
      for (int s = 0;; ++s) {
        if (steps < max_steps) launch(steps), ++steps;  // before step s's token is read
        done[s % 2].wait();
        if (!on_step(result_of(s)) || s + 1 == steps) break;
      }
    } catch (...) {  // what was queued runs: the state must count it
      if (steps > 0) done[(steps - 1) % 2].wait();
      state.advance(steps);
      throw;
    }
    done[(steps - 1) % 2].wait();
    state.advance(steps);
    return steps;
  }

  const Model& m_;
  const ModelConfig& cfg_;
  const ModelWeights& w_;
  std::shared_ptr<DeviceWeights> weights_;
  std::unique_ptr<DeviceExpertStore> pool_;  // an engine directory's; borrows the model's host store
  std::unique_ptr<HybridExperts> hybrid_;    // the hybrid decode's placement and CPU side, or null
  std::string hybrid_off_;                   // why --cpu-experts auto copies every miss, where it does
  bool graphs_ = false;  // decode steps through forward_captured (ModelOptions::cuda_graphs)
};

const CudaExecutor* cuda_executor(const Model& model) { return dynamic_cast<const CudaExecutor*>(&model.executor()); }

}  // namespace

void check_cuda_load(const ModelOptions& opt) {
  if (!cuda::cuda_available()) fail("--device cuda: no CUDA device (or no driver that can run this build) is present");
  if (opt.memory_budget)
    fail("--memory budgets the CPU backend; on the GPU (--device cuda) give --vram and --host-cache, or run with "
         "--device cpu");
}

std::unique_ptr<Executor> make_cuda_executor(Model& model, const std::string& dir, const ModelOptions& opt) {
  return std::make_unique<CudaExecutor>(model, dir, opt);
}

const DeviceExpertStore* vram_pool(const Model& model) {
  const CudaExecutor* e = cuda_executor(model);
  return e ? e->vram_pool() : nullptr;
}

bool decode_graphs(const Model& model) {
  const CudaExecutor* e = cuda_executor(model);
  return e && e->decode_graphs();
}

bool decodes_ahead(const Model& model) {
  const CudaExecutor* e = cuda_executor(model);
  return e && e->decodes_ahead();
}

}  // namespace ms
