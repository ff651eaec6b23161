#include "model/model.h"

#include <algorithm>
#include <filesystem>

#include "kernels/cpu/ops.h"
#include "model/blocks.h"
#include "util/error.h"
#include "util/half.h"

namespace ms {

Model::Model(TensorStore store, ModelConfig cfg, std::unique_ptr<ExpertStore> experts, MemoryPlan plan)
    : store_(std::move(store)), cfg_(std::move(cfg)), experts_(std::move(experts)), plan_(plan) {
  w_ = load_weights(cfg_, store_, experts_.get());
}

namespace {

std::string gib(uint64_t b) {
  return b >= (1ull << 30) ? fmt::format("{:.2f} GiB", double(b) / double(1ull << 30)) : fmt::format("{:.1f} MiB", double(b) / double(1ull << 20));
}

// Splits a memory budget: dense weights (the whole dense file: it is mapped), KV and recurrent
// state for `context` tokens, activations of a prefill chunk, and the rest as equal pools.
MemoryPlan plan_memory(const ModelConfig& cfg, const EngineIndex& index, uint64_t dense_bytes, const ModelOptions& opt) {
  MemoryPlan p;
  p.dense = dense_bytes;
  int full = 0;
  for (auto t : cfg.layer_types) full += t == LayerType::FullAttention;
  const uint64_t kv_per_token = uint64_t(full + 1) * 2 * uint64_t(cfg.n_kv_heads) * uint64_t(cfg.head_dim) * sizeof(float);
  const uint64_t linear = uint64_t(cfg.n_layers - full) *
                          (uint64_t(cfg.lin_v_heads) * cfg.lin_k_dim * cfg.lin_v_dim +
                           uint64_t(2 * cfg.lin_k_heads * cfg.lin_k_dim + cfg.lin_v_heads * cfg.lin_v_dim) * 4) * sizeof(float);
  p.kv = kv_per_token * uint64_t(opt.context) + linear;
  // A prefill chunk's activations: hidden states, projections and logits of 512 tokens.
  p.activations = 512ull * (16ull * cfg.hidden + uint64_t(cfg.vocab)) * sizeof(float);
  uint64_t per_slot = 0;  // one slot in every MoE layer
  for (const auto& l : index.layers) per_slot += l.stride;
  const uint64_t fixed = p.dense + p.kv + p.activations;
  const uint64_t floor = fixed + per_slot * uint64_t(cfg.top_k);
  if (opt.memory_budget < floor)
    fail("memory budget {} is below the floor of {}: dense weights {}, KV/state for {} tokens {}, activations {}, "
         "and {} expert slots per layer x {} layers ({} per slot row)",
         gib(opt.memory_budget), gib(floor), gib(p.dense), opt.context, gib(p.kv), gib(p.activations), cfg.top_k,
         index.layers.size(), gib(per_slot));
  p.slots = int(std::min<uint64_t>((opt.memory_budget - fixed) / per_slot, uint64_t(cfg.n_experts)));
  p.pool = per_slot * uint64_t(p.slots);
  return p;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& opt) {
  ModelConfig cfg = load_config(dir);
  if (!is_engine_dir(dir)) return std::unique_ptr<Model>(new Model(TensorStore::open(dir), std::move(cfg), nullptr, {}));
  EngineIndex index = read_engine_index(dir, cfg);
  const std::string dense_path = dir + "/" + kEngineDenseFile;
  TensorStore dense = TensorStore::open(dense_path);
  StoreOptions store_opt = opt.experts;
  MemoryPlan plan;
  if (opt.memory_budget > 0) {
    plan = plan_memory(cfg, index, std::filesystem::file_size(dense_path), opt);
    store_opt.slots = plan.slots;
    store_opt.layer_caps.clear();
  }
  for (const auto& l : index.layers) {
    int cap = store_opt.slots > 0 ? store_opt.slots : l.n_experts;
    if (auto it = store_opt.layer_caps.find(model_layer_of(l.name)); it != store_opt.layer_caps.end()) cap = it->second;
    if (cap < cfg.top_k)
      fail("{}: {} expert slots for layer {} cannot hold one token's {} routed experts", dir, cap, l.name, cfg.top_k);
  }
  auto experts = std::make_unique<ExpertStore>(dir, index, store_opt);
  return std::unique_ptr<Model>(new Model(std::move(dense), std::move(cfg), std::move(experts), plan));
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

// x += attention(norm(x)); x += ffn(norm(x))
void Model::decoder_layer(const LayerWeights& lw, const float* x_in, int T, KVCache& kv, LinearState* lin, int pos0,
                          float* x, int* routes, float* router_probs) const {
  const size_t n = size_t(T) * size_t(cfg_.hidden);
  const float offset = cfg_.zero_centred_norms() ? 1.f : 0.f;
  std::vector<float> h(n), y(n);
  if (x_in != x) std::copy_n(x_in, n, x);
  cpu::rmsnorm(x, T, cfg_.hidden, lw.input_norm.data(), offset, cfg_.rms_eps, h.data());
  if (lw.type == LayerType::FullAttention) attention_block(cfg_, lw.attn, h.data(), T, kv, pos0, y.data());
  else deltanet_block(cfg_, lw.linear, h.data(), T, *lin, y.data());
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
  cpu::rmsnorm(x, T, cfg_.hidden, lw.post_attention_norm.data(), offset, cfg_.rms_eps, h.data());
  ffn_block(cfg_, lw.ffn, lw.moe, h.data(), T, y.data(), routes, experts_.get(), router_probs);
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

ForwardResult Model::forward(const int* ids, int T, State& state, const ForwardOptions& opt) const {
  if (T <= 0) fail("forward needs at least one token");
  const int H = cfg_.hidden, pos0 = state.position();
  const float offset = cfg_.zero_centred_norms() ? 1.f : 0.f;
  ForwardResult r;
  std::vector<float> x(size_t(T) * size_t(H));
  embed(ids, T, x.data());
  if (opt.routes) {
    r.routes.resize(size_t(cfg_.n_layers));
    r.router_probs.resize(size_t(cfg_.n_layers));
  }
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerWeights& lw = w_.layers[size_t(l)];
    int* routes = nullptr;
    float* probs = nullptr;
    if (opt.routes && lw.moe) {
      r.routes[size_t(l)].resize(size_t(T) * size_t(cfg_.top_k));
      r.router_probs[size_t(l)].resize(size_t(T) * size_t(cfg_.n_experts));
      routes = r.routes[size_t(l)].data();
      probs = r.router_probs[size_t(l)].data();
    }
    LinearState* lin = lw.type == LayerType::LinearAttention ? &state.linear(l) : nullptr;
    decoder_layer(lw, x.data(), T, state.kv(l), lin, pos0, x.data(), routes, probs);
  }
  state.advance(T);

  std::vector<float> xn(x.size());
  cpu::rmsnorm(x.data(), T, H, w_.final_norm.data(), offset, cfg_.rms_eps, xn.data());
  const int rows = opt.all_logits ? T : 1;
  r.logits.resize(size_t(rows) * size_t(cfg_.vocab));
  cpu::matmul(xn.data() + size_t(T - rows) * size_t(H), rows, w_.lm_head, r.logits.data());
  if (opt.hidden) {
    r.hidden_pre_norm = std::move(x);
    r.hidden_post_norm = std::move(xn);
  }
  return r;
}

std::vector<float> Model::mtp_forward(const float* hidden, const int* next_ids, int T, int pos0, State& state) const {
  if (!w_.mtp) fail("this model has no MTP head (no mtp.* tensors)");
  const MtpWeights& m = *w_.mtp;
  const int H = cfg_.hidden;
  const size_t n = size_t(T) * size_t(H);
  std::vector<float> e(n), cat(2 * n), x(n);
  embed(next_ids, T, e.data());
  for (int t = 0; t < T; ++t) {  // concat(norm(embedding), norm(hidden)) per row
    float* row = cat.data() + size_t(t) * 2 * size_t(H);
    cpu::rmsnorm(e.data() + size_t(t) * size_t(H), 1, H, m.pre_fc_norm_embedding.data(), 1.f, cfg_.rms_eps, row);
    cpu::rmsnorm(hidden + size_t(t) * size_t(H), 1, H, m.pre_fc_norm_hidden.data(), 1.f, cfg_.rms_eps, row + H);
  }
  cpu::matmul(cat.data(), T, m.fc, x.data());
  decoder_layer(m.layer, x.data(), T, state.mtp_kv(), nullptr, pos0, x.data(), nullptr, nullptr);
  cpu::rmsnorm(x.data(), T, H, m.norm.data(), 1.f, cfg_.rms_eps, x.data());
  std::vector<float> logits(size_t(T) * size_t(cfg_.vocab));
  cpu::matmul(x.data(), T, w_.lm_head, logits.data());
  return logits;
}

}  // namespace ms
