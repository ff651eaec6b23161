#include "model/model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "model/backend_cpu.h"
#include "model/backend_cuda.h"
#include "model/blocks.h"
#include "util/error.h"
#include "util/half.h"
#if MOESTREAM_CUDA
#include "kernels/cuda/device.h"
#endif

namespace ms {

Model::Model(TensorStore store, ModelConfig cfg, std::unique_ptr<ExpertStore> experts, MemoryPlan plan,
             int kv_positions, int prefill_chunk)
    : store_(std::move(store)),
      cfg_(std::move(cfg)),
      experts_(std::move(experts)),
      plan_(plan),
      kv_positions_(kv_positions),
      prefill_chunk_(prefill_chunk) {
  w_ = load_weights(cfg_, store_, experts_.get());
}

namespace {

std::string gib(uint64_t b) {
  return b >= (1ull << 30) ? fmt::format("{:.2f} GiB", double(b) / double(1ull << 30)) : fmt::format("{:.1f} MiB", double(b) / double(1ull << 20));
}

uint64_t per_slot_row(const EngineIndex& index) {  // one slot in every MoE layer
  uint64_t b = 0;
  for (const auto& l : index.layers) b += l.stride;
  return b;
}

// Floats a forward keeps live per token at its peak (the buffers of model/*_block.cpp): x, its
// norm and the layer's output beside the largest block's working set, the quantized matmul's
// permuted copy of its input (kernels/cpu/quant_matmul.cpp) and the routes a forward may keep.
uint64_t activation_floats_per_token(const ModelConfig& c) {
  const uint64_t H = uint64_t(c.hidden), E = uint64_t(c.n_experts), K = uint64_t(c.top_k);
  const bool gated = c.arch == Arch::Qwen3Next;
  const uint64_t q_width = uint64_t(c.n_heads) * uint64_t(c.head_dim), kv_width = uint64_t(c.n_kv_heads) * uint64_t(c.head_dim);
  // proj [q_raw, k, v], q, gate, then the normed k or the attention's output
  const uint64_t attention = (gated ? 2 : 1) * q_width + 2 * kv_width + (gated ? 2 : 1) * q_width + std::max(kv_width, q_width);
  const uint64_t kd = uint64_t(c.lin_k_heads) * uint64_t(c.lin_k_dim), vd = uint64_t(c.lin_v_heads) * uint64_t(c.lin_v_dim);
  const uint64_t nv = uint64_t(c.lin_v_heads), conv = 2 * kd + vd;
  // proj [qkvz, ba], q k v z g beta, then the conv's input and output (and b, a) or the rule's output
  const uint64_t deltanet = (2 * kd + 2 * vd + 2 * nv) + (2 * kd + 2 * vd + 2 * nv) + std::max(2 * conv + 2 * nv, vd);
  const uint64_t dense = 2 * uint64_t(c.dense_inter);
  // the shared expert's output and its h, u; or router logits and probabilities, the routing, the
  // per-slot partials, an expert's gathered rows, its output and its h, u
  const uint64_t shared = c.shared_inter > 0 ? H : 0;
  const uint64_t moe = E ? shared + std::max(2 * uint64_t(c.shared_inter), 2 * E + 3 * K + K * H + 2 * H + 2 * uint64_t(c.moe_inter)) : 0;
  const uint64_t widest_input = std::max({H, q_width, vd, uint64_t(c.dense_inter), uint64_t(c.moe_inter), uint64_t(c.shared_inter)});
  const uint64_t routes = uint64_t(c.n_layers) * (K + E);
  return 3 * H + std::max({attention, deltanet, dense, moe}) + widest_input + routes;
}

// Splits a budget (`what`: "memory budget", "VRAM budget"): dense weights, KV and recurrent
// state for `context` tokens, activations of a prefill chunk, and the rest as equal pools. A
// model without routed experts (an empty index) needs only the first three.
MemoryPlan plan_memory(const ModelConfig& cfg, const EngineIndex& index, uint64_t dense_bytes, uint64_t budget,
                       const ModelOptions& opt, const char* what) {
  const int context = opt.context;
  MemoryPlan p;
  p.dense = dense_bytes;
  int full = 0;
  for (auto t : cfg.layer_types) full += t == LayerType::FullAttention;
  const uint64_t kv_per_token = uint64_t(full + 1) * 2 * uint64_t(cfg.n_kv_heads) * uint64_t(cfg.head_dim) * sizeof(float);
  const uint64_t linear = uint64_t(cfg.n_layers - full) *
                          (uint64_t(cfg.lin_v_heads) * cfg.lin_k_dim * cfg.lin_v_dim +
                           uint64_t(2 * cfg.lin_k_heads * cfg.lin_k_dim + cfg.lin_v_heads * cfg.lin_v_dim) * 4) * sizeof(float);
  p.kv = kv_per_token * uint64_t(context) + linear;
  // A prefill chunk's activations (Model::next_chunk keeps every forward within one; a context
  // shorter than a chunk holds no longer prompt) and the last position's logits.
  const uint64_t chunk = uint64_t(std::min(opt.prefill_chunk, context));
  p.activations = (chunk * activation_floats_per_token(cfg) + uint64_t(cfg.vocab)) * sizeof(float);
  const uint64_t per_slot = per_slot_row(index);
  const uint64_t floor = p.fixed() + per_slot * uint64_t(cfg.top_k);
  if (budget < floor) {
    const std::string pools =
        per_slot ? fmt::format(", and {} expert slots per layer x {} layers ({} per slot row)", cfg.top_k,
                               index.layers.size(), gib(per_slot))
                 : std::string();
    fail("{} {} is below the floor of {}: dense weights {}, KV/state for {} tokens {}, activations {}{}", what,
         gib(budget), gib(floor), gib(p.dense), context, gib(p.kv), gib(p.activations), pools);
  }
  if (per_slot == 0) return p;
  p.slots = int(std::min<uint64_t>((budget - p.fixed()) / per_slot, uint64_t(cfg.n_experts)));
  p.pool = per_slot * uint64_t(p.slots);
  return p;
}

// A checkpoint directory streams nothing: its experts are dense weights, and a budget below them
// all is refused with the way out.
MemoryPlan plan_checkpoint(const std::string& dir, const ModelConfig& cfg, uint64_t weight_bytes, uint64_t budget,
                           const ModelOptions& opt, const char* what) {
  try {
    return plan_memory(cfg, EngineIndex{}, weight_bytes, budget, opt, what);
  } catch (const Error& e) {
    fail("{}: {}; a checkpoint directory keeps every expert in memory: `moestream convert` it to stream them", dir,
         e.what());
  }
}

// A chunk the DeltaNet kernels split as a whole prefill does, with room to move one alignment back.
void check_prefill_chunk(int chunk) {
  if (chunk < 2 * kPrefillChunkAlign || chunk % kPrefillChunkAlign != 0)
    fail("prefill chunk {} must be a multiple of {} and at least {}", chunk, kPrefillChunkAlign, 2 * kPrefillChunkAlign);
}

void check_floor(const std::string& dir, const StoreOptions& o, const EngineIndex& index, int top_k, const char* where) {
  for (const auto& l : index.layers)
    if (const int cap = layer_capacity(o, l); cap < top_k)
      fail("{}: {} {}expert slots for layer {} cannot hold one token's {} routed experts", dir, cap, where, l.name, top_k);
}

// The host tier under the VRAM pool: a cache of `host_cache` bytes (equal slots per layer), or
// staging slots for one token's experts that keep nothing.
StoreOptions host_tier_options(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index,
                               const ModelOptions& opt) {
  StoreOptions h;
  h.io = opt.experts.io;
  h.direct_io = opt.experts.direct_io;
  h.verify = opt.experts.verify;
  h.top_k = cfg.top_k;
  h.policy = opt.host_policy;
  h.slots = cfg.top_k;
  h.cache = opt.host_cache > 0;
  if (h.cache) {
    const uint64_t row = per_slot_row(index);
    if (opt.host_cache < row * uint64_t(cfg.top_k))
      fail("{}: --host-cache {} cannot hold one token's {} experts in every layer ({} per slot row)", dir,
           gib(opt.host_cache), cfg.top_k, gib(row));
    h.slots = int(std::min<uint64_t>(opt.host_cache / row, uint64_t(cfg.n_experts)));
  }
  return h;
}

#if MOESTREAM_CUDA
// What a load without --vram plans with: 90 % of the free VRAM (the unsized pools, the embedding).
uint64_t usable_free_vram() { return cuda::free_memory() / 10 * 9; }
#endif

}  // namespace

Device default_device() {
#if MOESTREAM_CUDA
  if (cuda::cuda_available()) return Device::Cuda;
#endif
  return Device::Cpu;
}

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& opt) {
  if (opt.device == Device::Cpu) return load_on_host(dir, opt);
#if MOESTREAM_CUDA
  if (!cuda::cuda_available()) fail("--device cuda: no CUDA device (or no driver that can run this build) is present");
  if (opt.memory_budget)
    fail("--memory budgets the CPU backend; on the GPU (--device cuda) give --vram and --host-cache, or run with "
         "--device cpu");
  std::unique_ptr<Model> m = load_on_host(dir, opt);
  const auto weights = std::make_shared<DeviceWeights>(m->w_);
  m->device_ = weights;
  if (m->experts_) {
    StoreOptions vram = opt.experts;
    vram.top_k = m->cfg_.top_k;
    const EngineIndex& index = m->experts_->index();
    if (opt.vram_budget) {
      m->plan_ = plan_memory(m->cfg_, index, m->device_->bytes(), opt.vram_budget, opt, "VRAM budget");
      vram.slots = m->plan_.slots;
      vram.layer_caps.clear();
    } else if (vram.slots == 0 && vram.layer_caps.empty()) {
      // Unsized: every expert when they fit in 90 % of the free VRAM, else the pools get that.
      const uint64_t budget = m->device_->bytes() + usable_free_vram();
      const MemoryPlan p = plan_memory(m->cfg_, index, m->device_->bytes(), budget, opt, "free VRAM");
      if (p.slots < m->cfg_.n_experts) m->plan_ = p, vram.slots = p.slots;
    }
    check_floor(dir, vram, index, m->cfg_.top_k, "VRAM ");
    m->device_experts_ = std::make_shared<DeviceExpertStore>(*m->experts_, vram);
  } else if (opt.vram_budget) {
    m->plan_ = plan_checkpoint(dir, m->cfg_, m->device_->bytes(), opt.vram_budget, opt, "VRAM budget");
  }
  m->decode_graphs_ = opt.cuda_graphs && m->every_expert_resident();
  // Only decode ahead reads the embedding on the GPU, so it takes VRAM only where decode steps are
  // graphs, out of what the pools left: the budget's rest, or free VRAM as an unsized pool takes.
  if (m->decode_graphs_) {
    const uint64_t planned = m->plan_.total();
    const uint64_t room = opt.vram_budget ? opt.vram_budget - std::min(opt.vram_budget, planned) : usable_free_vram();
    weights->add_embedding(m->w_.embed, room);
  }
  return m;
#else
  fail("--device cuda: this build has no CUDA backend (nvcc was not found when it was configured)");
#endif
}

std::unique_ptr<Model> Model::load_on_host(const std::string& dir, const ModelOptions& opt) {
  check_prefill_chunk(opt.prefill_chunk);
  ModelConfig cfg = load_config(dir);
  if (!is_engine_dir(dir)) {
    std::unique_ptr<Model> m(new Model(TensorStore::open(dir), std::move(cfg), nullptr, {}, opt.context, opt.prefill_chunk));
    if (opt.device == Device::Cpu && opt.memory_budget > 0)
      m->plan_ = plan_checkpoint(dir, m->cfg_, m->w_.dense_bytes + m->w_.expert_bytes, opt.memory_budget, opt,
                                 "memory budget");
    return m;
  }
  EngineIndex index = read_engine_index(dir, cfg);
  if (opt.experts.verify) verify_dense(dir, index);  // the expert records are checked as they are read
  const std::string dense_path = dir + "/" + kEngineDenseFile;
  TensorStore dense = TensorStore::open(dense_path);
  StoreOptions store_opt = opt.experts;
  store_opt.top_k = cfg.top_k;
  MemoryPlan plan;
  if (opt.device == Device::Cuda) {
    store_opt = host_tier_options(dir, cfg, index, opt);
  } else if (opt.memory_budget > 0) {
    plan = plan_memory(cfg, index, std::filesystem::file_size(dense_path), opt.memory_budget, opt, "memory budget");
    store_opt.slots = plan.slots;
    store_opt.layer_caps.clear();
  }
  check_floor(dir, store_opt, index, cfg.top_k, opt.device == Device::Cuda ? "host " : "");
  auto experts = std::make_unique<ExpertStore>(dir, index, store_opt);
  return std::unique_ptr<Model>(new Model(std::move(dense), std::move(cfg), std::move(experts), plan, opt.context,
                                                opt.prefill_chunk));
}

#if MOESTREAM_CUDA
// Whether a decode step's MoE layers all route on the GPU to resident experts (moe_on_device with
// a table), so that the step reads nothing back before its logits.
bool Model::every_expert_resident() const {
  for (const LayerWeights& lw : w_.layers)
    if (lw.moe && (!device_experts_ || lw.ffn.store_layer < 0 || !device_experts_->resident_table(lw.ffn.store_layer)))
      return false;
  return true;
}
#endif

std::vector<LayerStats> Model::pool_stats() const {
#if MOESTREAM_CUDA
  if (device_experts_) return device_experts_->stats();
#endif
  return experts_ ? experts_->stats() : std::vector<LayerStats>{};
}

size_t Model::pool_bytes() const {
#if MOESTREAM_CUDA
  if (device_experts_) return device_experts_->resident_bytes();
#endif
  return experts_ ? experts_->resident_bytes() : 0;
}

void Model::embed(const int* ids, int T, float* out) const {
  const size_t H = size_t(cfg_.hidden);
  for (int t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= cfg_.vocab) fail("token id {} at position {} is outside the vocabulary [0, {})", ids[t], t, cfg_.vocab);
    const size_t row = size_t(ids[t]) * H;
    float* o = out + size_t(t) * H;
    if (w_.embed.type == WeightType::Affine) {
      dequantize_row(w_.embed.quant(), ids[t], o);
    } else if (w_.embed.type == WeightType::BF16) {
      const bf16* src = static_cast<const bf16*>(w_.embed.data) + row;
      for (size_t h = 0; h < H; ++h) o[h] = bf16_to_f32(src[h]);
    } else {
      std::copy_n(static_cast<const float*>(w_.embed.data) + row, H, o);
    }
  }
}

// x += attention(h); x += ffn(norm(x)); h = next_norm(x). h enters as the layer's input norm of x,
// so that each residual add and the norm after it are one add_rmsnorm.
template <class B>
void Model::decoder_layer(const B& be, const LayerWeights& lw, int T, typename B::KV& kv, typename B::Linear* lin,
                          int pos0, float* x, float* h, const std::vector<float>& next_norm, int* routes,
                          float* router_probs) const {
  const size_t n = size_t(T) * size_t(cfg_.hidden);
  const float offset = norm_offset();
  typename B::Buf y = be.alloc(n);
  if (lw.type == LayerType::FullAttention) attention_block(be, cfg_, lw.attn, h, T, kv, pos0, y.data());
  else deltanet_block(be, cfg_, lw.linear, h, T, *lin, y.data());
  be.add_rmsnorm(x, y.data(), T, cfg_.hidden, be.vec(lw.post_attention_norm), offset, cfg_.rms_eps, h);
  ffn_block(be, cfg_, lw.ffn, lw.moe, h, T, y.data(), routes, router_probs);
  be.add_rmsnorm(x, y.data(), T, cfg_.hidden, be.vec(next_norm), offset, cfg_.rms_eps, h);
}

void Model::check_ids(const int* ids, int T) const {
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= cfg_.vocab)
      fail("token id {} at position {} is outside the vocabulary [0, {})", ids[t], t, cfg_.vocab);
}

int Model::next_chunk(int remaining) const {
  if (remaining <= prefill_chunk_) return remaining;
  return remaining - prefill_chunk_ == 1 ? prefill_chunk_ - kPrefillChunkAlign : prefill_chunk_;
}

namespace {

template <class T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// A chunk's result after those of the chunks before it: rows appended, the last's logits and token.
void join_chunk(ForwardResult& all, ForwardResult&& chunk, bool all_logits) {
  if (all_logits) append(all.logits, chunk.logits);
  else all.logits = std::move(chunk.logits);
  all.token = chunk.token;
  append(all.hidden_pre_norm, chunk.hidden_pre_norm);
  append(all.hidden_post_norm, chunk.hidden_post_norm);
  all.routes.resize(chunk.routes.size());
  all.router_probs.resize(chunk.router_probs.size());
  for (size_t l = 0; l < chunk.routes.size(); ++l) append(all.routes[l], chunk.routes[l]);
  for (size_t l = 0; l < chunk.router_probs.size(); ++l) append(all.router_probs[l], chunk.router_probs[l]);
}

}  // namespace

ForwardResult Model::forward(const int* ids, int T, State& state, const ForwardOptions& opt) const {
  if (T <= 0) fail("forward needs at least one token");
  check_ids(ids, T);  // all of them before a chunk changes the state
  if (T <= prefill_chunk_) return forward_chunk(ids, T, state, opt);
  ForwardResult all;
  for (int done = 0; done < T;) {
    const int n = next_chunk(T - done);
    ForwardOptions o = opt;
    if (done + n < T) {  // only the last chunk's logits are asked for, unless every row's are
      o.sample = nullptr;
      o.logits = opt.all_logits;
    }
    join_chunk(all, forward_chunk(ids + done, n, state, o), opt.all_logits);
    done += n;
  }
  return all;
}

ForwardResult Model::forward_chunk(const int* ids, int T, State& state, const ForwardOptions& opt) const {
  ForwardResult r;
#if MOESTREAM_CUDA
  if (device_) {
    if (!state.device) state.device = std::make_shared<DeviceState>(cfg_, state.planned_positions());
    const CudaBackend be{*device_, *state.device, device_experts_.get()};
    if (T == 1 && decode_graphs_ && opt.logits)
      r = forward_captured(be, ids[0], state.position(), opt);
    else
      r = forward_on(be, ids, T, state.position(), opt);
  } else {
    r = forward_on(CpuBackend{state, experts_.get()}, ids, T, state.position(), opt);
  }
#else
  r = forward_on(CpuBackend{state, experts_.get()}, ids, T, state.position(), opt);
#endif
  state.advance(T);
  return r;
}

std::pair<int*, float*> Model::route_rows(ForwardResult& r, int l, int T) const {
  if (!w_.layers[size_t(l)].moe) return {nullptr, nullptr};
  std::vector<int>& ids = r.routes[size_t(l)];
  std::vector<float>& probs = r.router_probs[size_t(l)];
  ids.resize(size_t(T) * size_t(cfg_.top_k));
  probs.resize(size_t(T) * size_t(cfg_.n_experts));
  return {ids.data(), probs.data()};
}

template <class B>
void Model::run_layers(const B& be, float* x, float* xn, int T, int pos0, const ForwardOptions& opt,
                       ForwardResult& r) const {
  if (opt.routes) {
    r.routes.resize(size_t(cfg_.n_layers));
    r.router_probs.resize(size_t(cfg_.n_layers));
  }
  const auto& layers = w_.layers;
  be.rmsnorm(x, T, cfg_.hidden, be.vec(layers.empty() ? w_.final_norm : layers[0].input_norm), norm_offset(),
             cfg_.rms_eps, xn);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerWeights& lw = layers[size_t(l)];
    const auto [routes, probs] = opt.routes ? route_rows(r, l, T) : std::pair<int*, float*>{};
    typename B::Linear* lin = lw.type == LayerType::LinearAttention ? &be.linear(l) : nullptr;
    const std::vector<float>& next = l + 1 < cfg_.n_layers ? layers[size_t(l) + 1].input_norm : w_.final_norm;
    decoder_layer(be, lw, T, be.kv(l), lin, pos0, x, xn, next, routes, probs);
  }
}

template <class B>
void Model::final_logits(const B& be, const float* xn, int T, int rows, float* logits) const {
  be.matmul(xn + size_t(T - rows) * size_t(cfg_.hidden), rows, be.mat(w_.lm_head), logits);
}

template <class B>
ForwardResult Model::forward_on(const B& be, const int* ids, int T, int pos0, const ForwardOptions& opt) const {
  ForwardResult r;
  std::vector<float> embedded(size_t(T) * size_t(cfg_.hidden));
  embed(ids, T, embedded.data());
  typename B::Buf x = be.upload(std::move(embedded));
  typename B::Buf xn = be.alloc(x.size());
  run_layers(be, x.data(), xn.data(), T, pos0, opt, r);
  typename B::Buf logits;
  if (opt.logits) {
    const int rows = opt.all_logits ? T : 1;
    logits = be.alloc(size_t(rows) * size_t(cfg_.vocab));
    final_logits(be, xn.data(), T, rows, logits.data());
    if (opt.sample) r.token = opt.sample(logits.data() + size_t(rows - 1) * size_t(cfg_.vocab), B::kOnDevice);
  }
  be.finish();
  if (opt.logits && (!opt.sample || opt.all_logits)) r.logits = be.to_host(std::move(logits));
  if (opt.hidden) {
    r.hidden_pre_norm = be.to_host(std::move(x));
    r.hidden_post_norm = be.to_host(std::move(xn));
  }
  return r;
}

#if MOESTREAM_CUDA
namespace {
// Positions a captured step at pos0 makes its KV caches hold: 512 past it, since each growth
// moves the caches and so costs a capture, but no more than the planned context while pos0 is
// within it (kv_capacity).
int decode_kv_positions(int pos0, int planned) {
  constexpr int kRoom = 512;
  return pos0 < planned ? std::min(pos0 + kRoom, planned) : pos0 + kRoom;
}
}  // namespace

std::vector<const float*> Model::decode_step_kv(DeviceState& ds, int pos0) const {
  std::vector<const float*> kv;
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

void Model::capture_if_stale(const CudaBackend& be, int pos0, std::vector<const float*> kv, StepKind kind) const {
  DeviceState& ds = be.state;
  if (ds.decode_graph && ds.decode_graph->fits(kind, kv)) return;
  ds.decode_graph.reset();  // its arena back before the new capture takes one
  ds.decode_graph = capture_decode_step(be, pos0, std::move(kv), kind);
}

ForwardResult Model::forward_captured(const CudaBackend& be, int id, int pos0, const ForwardOptions& opt) const {
  const int H = cfg_.hidden;
  DeviceState& ds = be.state;
  capture_if_stale(be, pos0, decode_step_kv(ds, pos0), StepKind::HostInput);
  const DecodeGraph& g = *ds.decode_graph;

  std::vector<float> input(size_t(H) + 1);
  embed(&id, 1, input.data());
  std::memcpy(input.data() + H, &pos0, sizeof(int));
  copy_to_device_async(g.input.data(), input.data(), input.size() * sizeof(float));
  g.graph.launch();

  ForwardResult r;
  if (opt.sample) r.token = opt.sample(g.logits.data(), true);
  if (!opt.sample || opt.all_logits) r.logits = g.logits.to_vector();
  if (opt.routes) {  // what the step's route_topk wrote to ds.route_ids and route_probs (moe_on_device)
    r.routes.resize(size_t(cfg_.n_layers));
    r.router_probs.resize(size_t(cfg_.n_layers));
    for (int l = 0; l < cfg_.n_layers; ++l)
      if (const auto [ids, probs] = route_rows(r, l, 1); ids)
        be.pending_routes.push_back({ids, probs, w_.layers[size_t(l)].ffn.store_layer});
    be.finish();
  }
  if (opt.hidden) {
    r.hidden_pre_norm.resize(size_t(H));
    copy_to_host(r.hidden_pre_norm.data(), g.input.data(), size_t(H) * sizeof(float));
    r.hidden_post_norm = g.normed.to_vector();
  }
  return r;
}

std::unique_ptr<DecodeGraph> Model::capture_decode_step(const CudaBackend& be, int pos0,
                                                        std::vector<const float*> kv_at_capture, StepKind kind) const {
  auto g = std::make_unique<DecodeGraph>();
  g->input = DeviceArray<float>(size_t(cfg_.hidden) + 1);
  g->normed = DeviceArray<float>(size_t(cfg_.hidden));
  g->logits = DeviceArray<float>(size_t(cfg_.vocab));
  g->kv_at_capture = std::move(kv_at_capture);
  g->kind = kind;
  DeviceState& ds = be.state;
  const bool ahead = kind != StepKind::HostInput, routes = kind == StepKind::AheadWithRoutes;
  if (ahead) {
    g->token = DeviceArray<int>(1);
    cuda::fit_workspace(g->sampler, cfg_.vocab);
    if (!ds.decode_ring) ds.decode_ring = std::make_unique<cuda::MappedInts>(DeviceState::kDecodeRing);
  }
  if (routes && !ds.decode_route_ring)
    ds.decode_route_ring = std::make_unique<cuda::MappedInts>(DeviceState::kDecodeRing * ds.route_ids.size());
  const CudaBackend step{be.weights, be.state, be.experts, g->position()};
  {
    ArenaScope scope(g->arena);
    g->graph.begin_capture();
    try {
      if (ahead) cuda::embed_row(step.mat(w_.embed), g->token.data(), g->input.data());
      ForwardResult unused;  // the routes go to ds.route_ids and route_probs, whence forward_captured reads them
      run_layers(step, g->input.data(), g->normed.data(), 1, pos0, ForwardOptions{}, unused);
      final_logits(step, g->normed.data(), 1, 1, g->logits.data());
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
#endif

bool Model::decodes_ahead() const {
#if MOESTREAM_CUDA
  return device_ && decode_graphs_ && device_->has(w_.embed);
#else
  return false;
#endif
}

int Model::decode_ahead(State& state, int first, int max_steps, bool routes,
                        const std::function<bool(const ForwardResult&)>& on_step) const {
  if (!decodes_ahead()) fail("decode_ahead needs the CUDA backend with decode graphs and a bf16 or affine embedding");
  if (first < 0 || first >= cfg_.vocab) fail("token id {} is outside the vocabulary [0, {})", first, cfg_.vocab);
  if (max_steps <= 0) return 0;
#if MOESTREAM_CUDA
  if (!state.device) state.device = std::make_shared<DeviceState>(cfg_, state.planned_positions());
  const CudaBackend be{*device_, *state.device, device_experts_.get()};
  DeviceState& ds = *state.device;
  const StepKind kind = routes ? StepKind::AheadWithRoutes : StepKind::Ahead;
  const int pos0 = state.position();
  auto slot = [&](int step) { return size_t((pos0 + step) % DeviceState::kDecodeRing); };
  cuda::ComputeMark done[2];  // step s's, in done[s % 2]: at most two steps are queued
  auto launch = [&](int step) {
    const int pos = pos0 + step;
    std::vector<const float*> kv = decode_step_kv(ds, pos);
    if (step == 0 || !ds.decode_graph || !ds.decode_graph->fits(kind, kv)) {
      // A graph made now starts from the host's token and position: the step before's must be
      // done, its token read, and its graph no longer running.
      if (step > 0) done[(step - 1) % 2].wait();
      const int in[2] = {step == 0 ? first : ds.decode_ring->host()[slot(step - 1)], pos};
      capture_if_stale(be, pos, std::move(kv), kind);
      copy_to_device(ds.decode_graph->token.data(), &in[0], sizeof(int));
      copy_to_device(ds.decode_graph->position(), &in[1], sizeof(int));
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
#else
  (void)state, (void)routes, (void)on_step;
  return 0;
#endif
}

std::vector<float> Model::mtp_forward(const float* hidden, const int* next_ids, int T, int pos0, State& state) const {
  if (!w_.mtp) fail("this model has no MTP head (no mtp.* tensors)");
  if (T <= 0) fail("mtp_forward needs at least one row");
  // In chunks as forward's prompts: the head is one full-attention layer, whose rows do not
  // depend on the chunk they run in.
  std::vector<float> logits;
  for (int done = 0; done < T;) {
    const int n = next_chunk(T - done);
    append(logits, mtp_chunk(hidden + size_t(done) * size_t(cfg_.hidden), next_ids + done, n, pos0 + done, state));
    done += n;
  }
  return logits;
}

std::vector<float> Model::mtp_chunk(const float* hidden, const int* next_ids, int T, int pos0, State& state) const {
#if MOESTREAM_CUDA
  if (device_) {
    if (!state.device) state.device = std::make_shared<DeviceState>(cfg_, state.planned_positions());
    return mtp_forward_on(CudaBackend{*device_, *state.device, device_experts_.get()}, hidden, next_ids, T, pos0);
  }
#endif
  return mtp_forward_on(CpuBackend{state, experts_.get()}, hidden, next_ids, T, pos0);
}

template <class B>
std::vector<float> Model::mtp_forward_on(const B& be, const float* hidden, const int* next_ids, int T, int pos0) const {
  const MtpWeights& m = *w_.mtp;
  const int H = cfg_.hidden;
  const size_t n = size_t(T) * size_t(H);
  std::vector<float> embedded(n);
  embed(next_ids, T, embedded.data());
  typename B::Buf e = be.upload(std::move(embedded)), hid = be.upload(std::vector<float>(hidden, hidden + n));
  typename B::Buf cat = be.alloc(2 * n), x = be.alloc(n);
  const float offset = norm_offset();
  for (int t = 0; t < T; ++t) {  // concat(norm(embedding), norm(hidden)) per row
    float* row = cat.data() + size_t(t) * 2 * size_t(H);
    be.rmsnorm(e.data() + size_t(t) * size_t(H), 1, H, be.vec(m.pre_fc_norm_embedding), offset, cfg_.rms_eps, row);
    be.rmsnorm(hid.data() + size_t(t) * size_t(H), 1, H, be.vec(m.pre_fc_norm_hidden), offset, cfg_.rms_eps, row + H);
  }
  be.matmul(cat.data(), T, be.mat(m.fc), x.data());
  typename B::Buf xn = be.alloc(n);
  be.rmsnorm(x.data(), T, H, be.vec(m.layer.input_norm), offset, cfg_.rms_eps, xn.data());
  decoder_layer(be, m.layer, T, be.mtp_kv(), nullptr, pos0, x.data(), xn.data(), m.norm, nullptr, nullptr);
  typename B::Buf logits = be.alloc(size_t(T) * size_t(cfg_.vocab));
  be.matmul(xn.data(), T, be.mat(w_.lm_head), logits.data());
  return be.to_host(std::move(logits));
}

}  // namespace ms
