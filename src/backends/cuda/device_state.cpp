#include "backends/cuda/device_state.h"

#include <algorithm>

#include "model/predict.h"
#include "util/error.h"

namespace ms {

DeviceRotation::DeviceRotation(const KvRotator& r)
    : kind(r.kind()),
      blocks(cuda::DeviceArray<float>::from(r.blocks().data(), r.blocks().size())),
      signs(cuda::DeviceArray<float>::from(r.signs().data(), r.signs().size())) {}

void DeviceKV::reserve(int n) {
  const int have = capacity();
  if (n <= have) return;
  const size_t cap = size_t(kv_capacity(n, have, planned));
  for (auto [a, stride] : {std::pair{&k, k_stride()}, std::pair{&v, v_stride()}}) {
    cuda::DeviceArray<uint8_t> grown(cap * stride);
    cuda::copy_on_device(grown.data(), a->data(), a->size());
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

DeviceState::DeviceState(const ModelConfig& cfg, int planned_positions, const KvFormat& f)
    : kv(size_t(cfg.n_layers)), linear(size_t(cfg.n_layers)), top_k(cfg.top_k), n_experts(cfg.n_experts) {
  const int conv_dim = 2 * cfg.lin_k_heads * cfg.lin_k_dim + cfg.lin_v_heads * cfg.lin_v_dim;
  std::shared_ptr<const DeviceRotation> rot;
  if (f.rotates(f.k) || f.rotates(f.v))
    rot = std::make_shared<const DeviceRotation>(KvRotator(f.rotation, cfg.head_dim, f.seed));
  for (int l = 0; l < cfg.n_layers; ++l) {
    if (cfg.layer_types[size_t(l)] == LayerType::FullAttention) {
      kv[size_t(l)] = make_kv_cache<DeviceKV>(cfg.n_kv_heads, cfg.head_dim, planned_positions, f, rot);
    } else {
      linear[size_t(l)].conv = zeros(size_t(conv_dim) * size_t(cfg.conv_kernel - 1));
      linear[size_t(l)].recurrent = zeros(size_t(cfg.lin_v_heads) * size_t(cfg.lin_k_dim) * size_t(cfg.lin_v_dim));
    }
  }
  mtp_kv = make_kv_cache<DeviceKV>(cfg.n_kv_heads, cfg.head_dim, planned_positions, f, rot);
  if (cfg.n_experts > 0) {  // a layer more than the decoder's: the MTP head's
    route_ids = cuda::DeviceArray<int>(size_t(cfg.n_layers + 1) * size_t(cfg.top_k));
    route_probs = cuda::DeviceArray<float>(size_t(cfg.n_layers + 1) * size_t(cfg.n_experts));
  }
}

PredictionSlots::PredictionSlots(size_t floats_per_slot, int slots)
    : per_slot_(floats_per_slot), host_(floats_per_slot * size_t(slots)), pin_(host_.data(), host_.size() * sizeof(float)),
      marks_(size_t(slots)) {}

int PredictionSlots::put(const float* device, size_t n) {
  if (n > per_slot_) fail("a prediction of {} logits does not fit a slot of {}", n, per_slot_);
  const int slot = next_;
  next_ = (next_ + 1) % size();
  cuda::copy_to_host_async(host_.data() + size_t(slot) * per_slot_, device, n * sizeof(float));
  marks_[size_t(slot)].record();
  return slot;
}

const float* PredictionSlots::take(int slot) const {
  marks_[size_t(slot)].wait();
  return host_.data() + size_t(slot) * per_slot_;
}

PredictionSlots& DeviceState::prediction_slots() {
  // Slots for the predictions of a few layers that route nothing on the host in between.
  constexpr int kSlots = 16;
  if (!prediction_slots_)
    prediction_slots_ = std::make_unique<PredictionSlots>(size_t(kPredictMaxTokens) * size_t(n_experts), kSlots);
  return *prediction_slots_;
}

DeviceState& DeviceState::of(State& state, const ModelConfig& cfg) {
  if (!state.device) state.device = std::make_shared<DeviceState>(cfg, state.planned_positions(), state.kv_format());
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
