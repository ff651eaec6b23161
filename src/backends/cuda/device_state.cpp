#include "backends/cuda/device_state.h"

#include <algorithm>

namespace ms {

void DeviceKV::reserve(int n) {
  const size_t per_pos = size_t(n_kv) * size_t(head_dim);
  const int have = int(k.size() / std::max<size_t>(1, per_pos));
  if (n <= have) return;
  const size_t cap = size_t(kv_capacity(n, have, planned));
  for (cuda::DeviceArray<float>* a : {&k, &v}) {
    cuda::DeviceArray<float> grown(cap * per_pos);
    cuda::copy_on_device(grown.data(), a->data(), a->size() * sizeof(float));
    *a = std::move(grown);
  }
}

namespace {
cuda::DeviceArray<float> zeros(size_t n) {
  cuda::DeviceArray<float> a(n);
  cuda::zero_on_device(a.data(), n * sizeof(float));
  return a;
}
}  // namespace

DeviceState::DeviceState(const ModelConfig& cfg, int planned_positions)
    : kv(size_t(cfg.n_layers)), linear(size_t(cfg.n_layers)), top_k(cfg.top_k), n_experts(cfg.n_experts) {
  const int conv_dim = 2 * cfg.lin_k_heads * cfg.lin_k_dim + cfg.lin_v_heads * cfg.lin_v_dim;
  for (int l = 0; l < cfg.n_layers; ++l) {
    if (cfg.layer_types[size_t(l)] == LayerType::FullAttention) {
      kv[size_t(l)].n_kv = cfg.n_kv_heads;
      kv[size_t(l)].head_dim = cfg.head_dim;
      kv[size_t(l)].planned = planned_positions;
    } else {
      linear[size_t(l)].conv = zeros(size_t(conv_dim) * size_t(cfg.conv_kernel - 1));
      linear[size_t(l)].recurrent = zeros(size_t(cfg.lin_v_heads) * size_t(cfg.lin_k_dim) * size_t(cfg.lin_v_dim));
    }
  }
  mtp_kv.n_kv = cfg.n_kv_heads;
  mtp_kv.head_dim = cfg.head_dim;
  mtp_kv.planned = planned_positions;
  if (cfg.n_experts > 0) {  // a layer more than the decoder's: the MTP head's
    route_ids = cuda::DeviceArray<int>(size_t(cfg.n_layers + 1) * size_t(cfg.top_k));
    route_probs = cuda::DeviceArray<float>(size_t(cfg.n_layers + 1) * size_t(cfg.n_experts));
  }
}

DeviceState& DeviceState::of(State& state, const ModelConfig& cfg) {
  if (!state.device) state.device = std::make_shared<DeviceState>(cfg, state.planned_positions());
  return static_cast<DeviceState&>(*state.device);  // only this backend makes a State's device caches
}

void DeviceState::download_linear(std::vector<LinearState>& host) const {
  for (size_t l = 0; l < host.size(); ++l) {
    cuda::copy_to_host(host[l].conv.data(), linear[l].conv.data(), host[l].conv.size() * sizeof(float));
    cuda::copy_to_host(host[l].recurrent.data(), linear[l].recurrent.data(), host[l].recurrent.size() * sizeof(float));
  }
}

void DeviceState::upload_linear(const std::vector<LinearState>& host) {
  for (size_t l = 0; l < host.size(); ++l) {
    cuda::copy_to_device(linear[l].conv.data(), host[l].conv.data(), host[l].conv.size() * sizeof(float));
    cuda::copy_to_device(linear[l].recurrent.data(), host[l].recurrent.data(), host[l].recurrent.size() * sizeof(float));
  }
}

}  // namespace ms
