#include "model/model.h"

#include <algorithm>

#include "kernels/cpu/ops.h"
#include "model/blocks.h"
#include "util/error.h"
#include "util/half.h"

namespace ms {

Model::Model(TensorStore store, ModelConfig cfg, std::unique_ptr<ExpertBlobs> blobs)
    : store_(std::move(store)), cfg_(std::move(cfg)), blobs_(std::move(blobs)) {
  w_ = load_weights(cfg_, store_, blobs_.get());
}

std::unique_ptr<Model> Model::load(const std::string& dir) {
  ModelConfig cfg = load_config(dir);
  if (!is_engine_dir(dir)) return std::unique_ptr<Model>(new Model(TensorStore::open(dir), std::move(cfg), nullptr));
  // The streaming expert pool (issue 6) will replace the mmap of the blobs.
  auto blobs = std::make_unique<ExpertBlobs>(dir, read_engine_index(dir, cfg));
  TensorStore dense = TensorStore::open(dir + "/" + kEngineDenseFile);
  return std::unique_ptr<Model>(new Model(std::move(dense), std::move(cfg), std::move(blobs)));
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
                          float* x, int* routes) const {
  const size_t n = size_t(T) * size_t(cfg_.hidden);
  const float offset = cfg_.zero_centred_norms() ? 1.f : 0.f;
  std::vector<float> h(n), y(n);
  if (x_in != x) std::copy_n(x_in, n, x);
  cpu::rmsnorm(x, T, cfg_.hidden, lw.input_norm.data(), offset, cfg_.rms_eps, h.data());
  if (lw.type == LayerType::FullAttention) attention_block(cfg_, lw.attn, h.data(), T, kv, pos0, y.data());
  else deltanet_block(cfg_, lw.linear, h.data(), T, *lin, y.data());
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
  cpu::rmsnorm(x, T, cfg_.hidden, lw.post_attention_norm.data(), offset, cfg_.rms_eps, h.data());
  ffn_block(cfg_, lw.ffn, lw.moe, h.data(), T, y.data(), routes);
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

ForwardResult Model::forward(const int* ids, int T, State& state, const ForwardOptions& opt) const {
  if (T <= 0) fail("forward needs at least one token");
  const int H = cfg_.hidden, pos0 = state.position();
  const float offset = cfg_.zero_centred_norms() ? 1.f : 0.f;
  ForwardResult r;
  std::vector<float> x(size_t(T) * size_t(H));
  embed(ids, T, x.data());
  if (opt.routes) r.routes.resize(size_t(cfg_.n_layers));
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerWeights& lw = w_.layers[size_t(l)];
    int* routes = nullptr;
    if (opt.routes && lw.moe) {
      r.routes[size_t(l)].resize(size_t(T) * size_t(cfg_.top_k));
      routes = r.routes[size_t(l)].data();
    }
    LinearState* lin = lw.type == LayerType::LinearAttention ? &state.linear(l) : nullptr;
    decoder_layer(lw, x.data(), T, state.kv(l), lin, pos0, x.data(), routes);
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
  decoder_layer(m.layer, x.data(), T, state.mtp_kv(), nullptr, pos0, x.data(), nullptr);
  cpu::rmsnorm(x.data(), T, H, m.norm.data(), 1.f, cfg_.rms_eps, x.data());
  std::vector<float> logits(size_t(T) * size_t(cfg_.vocab));
  cpu::matmul(x.data(), T, w_.lm_head, logits.data());
  return logits;
}

}  // namespace ms
