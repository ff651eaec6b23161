#pragma once
// Everything a sequence carries between forward calls: the KV cache of full-attention layers,
// the conv and recurrent state of Gated DeltaNet layers, and the position. A checkpoint can be
// taken at any position and restored later (speculative decoding rolls back rejected drafts).
#include <algorithm>
#include <memory>
#include <vector>

#include "format/config.h"
#include "quant/kv_quant.h"

namespace ms {

// Positions a KV cache holding `have` grows to when it must hold n: twice `have` (fewer moves),
// but no more than `planned` (the positions the memory plan counted, ModelOptions::context; 0:
// none) while n fits in them, so that a sequence within the planned context stays in its budget.
int kv_capacity(int n, int have, int planned);

struct KVCache {
  int n_kv = 0, head_dim = 0, length = 0;
  int planned = 0;  // kv_capacity's
  // How keys and values are stored (quant/kv_quant.h); the rotations of quantized sides, shared
  // by every cache of a state (null: not rotated).
  KvSide k_side, v_side;
  std::shared_ptr<const KvRotator> k_rot, v_rot;
  std::vector<uint8_t> k, v;  // [capacity, n_kv] rows of k_side / v_side

  // Makes room for positions [0, n), kv_capacity's.
  void reserve(int n);
  bool exact() const { return k_side.bits == 32 && v_side.bits == 32; }
  size_t k_stride() const { return size_t(n_kv) * k_side.row_bytes(head_dim); }  // bytes a position
  size_t v_stride() const { return size_t(n_kv) * v_side.row_bytes(head_dim); }
  uint8_t* k_at(int pos) { return k.data() + size_t(pos) * k_stride(); }
  uint8_t* v_at(int pos) { return v.data() + size_t(pos) * v_stride(); }
  int capacity() const { return int(k.size() / std::max<size_t>(1, k_stride())); }
  size_t bytes() const { return k.capacity() + v.capacity(); }
};

// A KV cache (KVCache, or the GPU's DeviceKV) of n_kv heads of hd in format f, planning for
// `planned` positions, holding the shared rotation `rot` for each side f rotates.
template <class Cache, class Rotation>
Cache make_kv_cache(int n_kv, int hd, int planned, const KvFormat& f, const Rotation& rot) {
  Cache c;
  c.n_kv = n_kv;
  c.head_dim = hd;
  c.planned = planned;
  c.k_side = f.k;
  c.v_side = f.v;
  if (f.rotates(f.k)) c.k_rot = rot;
  if (f.rotates(f.v)) c.v_rot = rot;
  return c;
}

struct LinearState {
  std::vector<float> conv;       // [conv_dim, kernel - 1]: the last inputs, oldest first
  std::vector<float> recurrent;  // [linear_num_value_heads, key_head_dim, value_head_dim]
};

// A sequence's caches where a backend keeps them off the host (backends/cuda/device_state.h).
struct DeviceCaches {
  virtual ~DeviceCaches() = default;
  // The linear-attention states to and from host memory (checkpoints); layers without one skip.
  virtual void download_linear(std::vector<LinearState>& host) const = 0;
  virtual void upload_linear(const std::vector<LinearState>& host) = 0;
};

class State {
 public:
  // planned_positions: the context the memory plan counted, which the KV caches do not outgrow
  // while the sequence fits in it (kv_capacity).
  // kv: how the KV caches store keys and values (float32 by default).
  explicit State(const ModelConfig& cfg, int planned_positions = 0, const KvFormat& kv = {});

  int position() const { return pos_; }
  int planned_positions() const { return planned_; }
  KVCache& kv(int layer) { return kv_[size_t(layer)]; }
  LinearState& linear(int layer) { return linear_[size_t(layer)]; }
  KVCache& mtp_kv() { return mtp_kv_; }
  void advance(int n) { pos_ += n; }
  size_t bytes() const;
  size_t kv_bytes() const;  // the KV caches' share of bytes()
  const KvFormat& kv_format() const { return kv_format_; }

  struct Checkpoint {
    int pos = 0;
    std::vector<LinearState> linear;
    std::vector<float> last_hidden;  // State::last_hidden where it was known at pos
  };
  // KV entries past a restored position are simply overwritten later, so a checkpoint needs
  // only the position and the (small, fixed-size) linear-attention states.
  Checkpoint checkpoint() const;
  void restore(const Checkpoint& c);
  void reset();

  // Speculative verification (ForwardOptions::verify) of T tokens from the current position
  // keeps each linear-attention layer's state after each token but the last, so that a rejected
  // suffix is dropped without replay. begin_steps readies room for them; step_state(t, layer) is
  // the state after token t; keep_steps(n) keeps the first n of the T tokens (n <= T), once the
  // forward has run and advanced the position past all T.
  void begin_steps(int T);
  LinearState& step_state(int t, int layer) { return steps_[size_t(t)][size_t(layer)]; }
  void keep_steps(int n);
  size_t step_bytes() const;  // what the kept per-token states hold now

  // What the MTP head (speculative decoding) needs next: rows [0, mtp_rows) of its cache hold
  // rows computed from the main model's hidden states, and last_hidden is the main model's
  // hidden state (before the final norm) at position() - 1, or empty where no forward kept it.
  // The speculative decoder keeps these; a restore or reset rolls them back with the position.
  int mtp_rows = 0;
  std::vector<float> last_hidden;
  bool knows_hidden_at(int pos) const { return !last_hidden.empty() && last_hidden_at_ == pos; }
  bool knows_last_hidden() const { return knows_hidden_at(pos_ - 1); }
  void set_last_hidden(const float* h, int hidden) {
    last_hidden.assign(h, h + hidden);
    last_hidden_at_ = pos_ - 1;
  }

  // The caches on the GPU once the sequence has run there (Device::Cuda); null on the CPU.
  // Checkpoints then hold the device's linear-attention states. A copied State shares these
  // caches: copy a position with checkpoint(), not by copying the State.
  std::shared_ptr<DeviceCaches> device;

 private:
  int pos_ = 0;
  int planned_ = 0;
  int last_hidden_at_ = -1;  // the position last_hidden belongs to
  KvFormat kv_format_;
  std::vector<KVCache> kv_;
  std::vector<LinearState> linear_;
  KVCache mtp_kv_;
  std::vector<std::vector<LinearState>> steps_;  // [token][layer], begin_steps'
  int steps_pos_ = 0, steps_T_ = 0;              // the verified tokens' first position and count
};

}  // namespace ms
