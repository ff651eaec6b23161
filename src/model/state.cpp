#include "model/state.h"

#include <algorithm>

#include "util/error.h"

namespace ms {

int kv_capacity(int n, int have, int planned) {
  if (n <= have) return have;
  const int doubled = std::max(n, 2 * have);
  return n <= planned ? std::min(doubled, planned) : doubled;
}

void KVCache::reserve(int n) {
  const int have = capacity();
  if (n <= have) return;
  const size_t cap = size_t(kv_capacity(n, have, planned));
  for (auto [a, stride] : {std::pair{&k, k_stride()}, std::pair{&v, v_stride()}}) {
    a->reserve(cap * stride);  // exactly: resize alone may take up to twice the old size
    a->resize(cap * stride);
  }
}

State::State(const ModelConfig& cfg, int planned_positions, const KvFormat& kv)
    : planned_(planned_positions), kv_format_(kv), kv_(size_t(cfg.n_layers)), linear_(size_t(cfg.n_layers)) {
  check_kv_format(kv, cfg.head_dim);
  std::shared_ptr<const KvRotator> rot;
  if (kv.rotates(kv.k) || kv.rotates(kv.v)) rot = std::make_shared<const KvRotator>(kv.rotation, cfg.head_dim, kv.seed);
  for (int l = 0; l < cfg.n_layers; ++l) {
    if (cfg.layer_types[size_t(l)] == LayerType::FullAttention) {
      kv_[size_t(l)] = make_kv_cache<KVCache>(cfg.n_kv_heads, cfg.head_dim, planned_positions, kv, rot);
    } else {
      const int conv_dim = 2 * cfg.lin_k_heads * cfg.lin_k_dim + cfg.lin_v_heads * cfg.lin_v_dim;
      linear_[size_t(l)].conv.assign(size_t(conv_dim) * size_t(cfg.conv_kernel - 1), 0.f);
      linear_[size_t(l)].recurrent.assign(size_t(cfg.lin_v_heads) * size_t(cfg.lin_k_dim) * size_t(cfg.lin_v_dim), 0.f);
    }
  }
  mtp_kv_ = make_kv_cache<KVCache>(cfg.n_kv_heads, cfg.head_dim, planned_positions, kv, rot);
}

size_t State::kv_bytes() const {
  size_t b = mtp_kv_.bytes();
  for (auto& c : kv_) b += c.bytes();
  return b;
}

size_t State::bytes() const {
  size_t b = kv_bytes();
  for (auto& s : linear_) b += (s.conv.size() + s.recurrent.size()) * sizeof(float);
  return b + step_bytes();
}

State::Checkpoint State::checkpoint() const {
  Checkpoint c{pos_, linear_, knows_last_hidden() ? last_hidden : std::vector<float>{}};
  if (device) device->download_linear(c.linear);
  return c;
}

void State::restore(const Checkpoint& c) {
  if (c.pos > pos_) fail("cannot restore a checkpoint at position {} ahead of the current position {}", c.pos, pos_);
  pos_ = c.pos;
  linear_ = c.linear;
  steps_T_ = 0;
  mtp_rows = std::min(mtp_rows, std::max(0, pos_ - 1));
  last_hidden = c.last_hidden;
  last_hidden_at_ = last_hidden.empty() ? -1 : pos_ - 1;
  if (device) device->upload_linear(linear_);
}

void State::begin_steps(int T) {
  if (device) fail("speculative verification keeps its per-token states on the host only");
  if (steps_.size() < size_t(std::max(0, T - 1))) steps_.resize(size_t(T - 1), linear_);
  steps_pos_ = pos_;
  steps_T_ = T;
}

void State::keep_steps(int n) {
  if (pos_ != steps_pos_ + steps_T_) fail("keep_steps: the state is not right after the verified tokens");
  if (n < 1 || n > steps_T_) fail("keep_steps: {} of {} verified tokens", n, steps_T_);
  if (n < steps_T_) std::swap(linear_, steps_[size_t(n - 1)]);  // steps_[n - 1] now stale: rewritten by the next verify
  pos_ = steps_pos_ + n;
  steps_T_ = 0;
}

size_t State::step_bytes() const {
  size_t b = 0;
  for (auto& t : steps_)
    for (auto& s : t) b += (s.conv.capacity() + s.recurrent.capacity()) * sizeof(float);
  return b;
}

void State::reset() {
  pos_ = 0;
  steps_T_ = 0;
  mtp_rows = 0;
  last_hidden.clear();
  last_hidden_at_ = -1;
  for (auto& s : linear_) {
    std::fill(s.conv.begin(), s.conv.end(), 0.f);
    std::fill(s.recurrent.begin(), s.recurrent.end(), 0.f);
  }
  if (device) device->upload_linear(linear_);
}

}  // namespace ms
