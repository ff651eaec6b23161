#pragma once
// A sequence's caches on the GPU (DeviceState: KV caches, DeltaNet states, the routes of a decode
// step) and its captured decode step (DecodeGraph).
#include <memory>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/ops.h"
#include "model/state.h"

namespace ms {

// A KV cache's rotation (quant/kv_quant.h, KvRotator) in device memory.
struct DeviceRotation {
  explicit DeviceRotation(const KvRotator& r);
  cuda::KvRotationView view() const { return {kind, blocks.data(), signs.data()}; }
  KvRotation kind;
  cuda::DeviceArray<float> blocks, signs;
};

// KVCache (model/state.h) in device memory.
struct DeviceKV {
  int n_kv = 0, head_dim = 0, length = 0;
  int planned = 0;  // kv_capacity's (model/state.h)
  KvSide k_side, v_side;
  std::shared_ptr<const DeviceRotation> k_rot, v_rot;  // null: not rotated
  cuda::DeviceArray<uint8_t> k, v;                     // [capacity, n_kv] rows of k_side / v_side

  void reserve(int n);  // kv_capacity's, keeping what is there
  bool exact() const { return k_side.bits == 32 && v_side.bits == 32; }
  size_t k_stride() const { return size_t(n_kv) * k_side.row_bytes(head_dim); }
  size_t v_stride() const { return size_t(n_kv) * v_side.row_bytes(head_dim); }
  uint8_t* k_at(int pos) const { return k.data() + size_t(pos) * k_stride(); }
  uint8_t* v_at(int pos) const { return v.data() + size_t(pos) * v_stride(); }
  int capacity() const { return int(k.size() / std::max<size_t>(1, k_stride())); }
  cuda::KvRowsView k_rows() const { return {k.data(), cuda::kv_side_view(k_side, head_dim)}; }
  cuda::KvRowsView v_rows() const { return {v.data(), cuda::kv_side_view(v_side, head_dim)}; }
};

struct DeviceLinear {  // LinearState in device memory
  cuda::DeviceArray<float> conv, recurrent;
};

// What a captured decode step takes from the host and gives back (DecodeGraph).
enum class StepKind {
  HostInput,        // the host's embedding and position in; the host reads logits and routes after it
  Ahead,            // embeds DecodeGraph::token; ends with the greedy token, the next position and decode_ring
  AheadWithRoutes,  // Ahead, and the step's routed ids to decode_route_ring
};

// A sequence's decode step (one token, every routed expert resident) captured as a CUDA graph
// (CudaExecutor): its input and outputs at fixed addresses, the position read on the GPU. The
// graph holds the addresses of the sequence's KV caches too: it is captured again when one
// grows (kv_at_capture). A step ahead (StepKind, CudaExecutor's decode) embeds its token on the GPU
// and ends with the greedy token, which is the next replay's, and the next position: replays
// then follow each other with nothing from the host between them.
struct DecodeGraph {
  cuda::DeviceArena arena;  // first: outlives the graph that uses it
  cuda::Graph graph;
  cuda::DeviceArray<float> input;   // [hidden + 1]: the token's embedding (the layers' x), then its position, an int
  cuda::DeviceArray<float> normed;  // [hidden]: x after the final norm
  cuda::DeviceArray<float> logits;  // [vocab]
  std::vector<const void*> kv_at_capture;
  StepKind kind = StepKind::HostInput;
  cuda::DeviceArray<int> token;    // ahead: [1], the token embedded, then the one picked
  cuda::SamplerWorkspace sampler;  // ahead: greedy_token's

  int* position() const { return reinterpret_cast<int*>(input.data() + input.size() - 1); }
  // Whether this graph runs a step of `k` over the KV caches at `kv` (else it must be captured anew).
  bool fits(StepKind k, const std::vector<const void*>& kv) const { return kind == k && kv_at_capture == kv; }
};

// Pinned host memory that a forward's expert predictions (model/predict.h) come back to without
// the host waiting: each put() queues a device-to-host copy into the next slot on the compute
// stream and marks it; the host reads a slot once its mark is done. A slot is reused in turn
// (later copies into it are ordered after earlier ones on the same stream).
class PredictionSlots {
 public:
  PredictionSlots(size_t floats_per_slot, int slots);
  // Queues the copy of n floats (n <= floats_per_slot) from device memory; returns the slot.
  int put(const float* device, size_t n);
  // The slot's floats, once its copy is done (waits for it).
  const float* take(int slot) const;
  int size() const { return int(marks_.size()); }

 private:
  size_t per_slot_;
  std::vector<float> host_;
  cuda::HostRegistration pin_;
  std::vector<cuda::ComputeMark> marks_;
  int next_ = 0;
};

// A State's caches on the GPU; State holds one once the sequence has run there.
struct DeviceState final : DeviceCaches {
  DeviceState(const ModelConfig& cfg, int planned_positions, const KvFormat& kv = {});  // State's
  // The state's, made at the sequence's first forward on the GPU.
  static DeviceState& of(State& state, const ModelConfig& cfg);
  void download_linear(std::vector<LinearState>& host) const override;
  void upload_linear(const std::vector<LinearState>& host) override;

  std::vector<DeviceKV> kv;
  std::vector<DeviceLinear> linear;
  DeviceKV mtp_kv;
  std::unique_ptr<DecodeGraph> decode_graph;  // made at the first decode step that can use one
  // Where an ahead step leaves its token for the host: slot position % kDecodeRing. It outlives
  // the graphs, which a cache's growth replaces while a step's token is still unread.
  static constexpr int kDecodeRing = 4;
  std::unique_ptr<cuda::MappedInts> decode_ring;
  std::unique_ptr<cuda::MappedInts> decode_route_ring;  // [kDecodeRing][route_ids.size()]: route_ids by slot
  // A decode token's routed ids [layer][top_k] and router probabilities [layer][n_experts], by
  // expert-store layer, where moe_decode writes them: one copy brings every layer's when the
  // forward asks for them, and a captured step writes them at addresses that stay.
  cuda::DeviceArray<int> route_ids;
  cuda::DeviceArray<float> route_probs;
  cuda::SamplerWorkspace sampler;  // CudaBackend::pick's
  int top_k = 0, n_experts = 0;
  // Where predicted experts' router logits come back (CudaBackend::to_host_later), made at first use.
  PredictionSlots& prediction_slots();

 private:
  std::unique_ptr<PredictionSlots> prediction_slots_;
};

}  // namespace ms
