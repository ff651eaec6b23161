#pragma once
// The hybrid decode (--cpu-experts): where the GPU is short of VRAM, each routed expert of a
// decode token or prompt chunk that is not in VRAM is either copied there (and computed by the
// GPU) or computed by the CPU cores from the host tier while the GPU computes the rest
// (experts/placement.h decides, from rates measured at start and kept current). The GPU's
// experts take the integer product (cuda::int_expert_records, a chunk's cuda::int_experts) and
// the CPU's cpu::int_expert gives the same bits; the slots' rows meet on the GPU in their fixed
// order: where an expert runs does not change the answer.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/device_store.h"
#include "experts/placement.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"

namespace ms {

class HybridExperts {
 public:
  // `proj`: the first layer's routed experts' layout (every layer's checked by the caller with
  // hybrid_layout). Measures the rates the placement starts from: the host-to-VRAM copy (the
  // store's), one expert on the CPU at the pool's thread count, top_k on the GPU, and the round
  // trip of a layer's input and rows; the store's statistics then start again.
  // Where `measure` is false (the pools hold every expert: nothing to place) the rates stay 0.
  HybridExperts(DeviceExpertStore& store, const CpuExperts& mode, const cuda::RecordMat (&proj)[3], int top_k,
                bool measure);

  const CpuExperts& mode() const { return mode_; }
  int hidden() const { return hidden_; }
  std::string describe() const;
  const PlacementRates& rates() const { return rates_; }

  // Where a decode token's K routed experts of `layer` run: the slots the GPU computes (in VRAM,
  // or copied there by the store's acquire), and those the CPU computes.
  struct Split {
    std::vector<int> gpu_slots, cpu_slots;
    int copied = 0;  // of the GPU's slots, those not in VRAM now
  };
  Split place(int layer, const int* ids, int K) const;
  // How many of a layer's misses (most worth keeping first) go to VRAM, `resident` of its
  // experts being there: the rest the CPU computes. place's rule, also what the prefetch of
  // predicted experts copies (DeviceExpertStore::set_copy_share).
  size_t copy_share(int layer, const std::vector<int>& misses, int resident) const;

  // A prompt chunk's experts of `layer` (`order`; users[e]: the (token · K + slot) entries expert
  // e serves): those in VRAM, the misses copied, and those the CPU computes (the misses serving
  // the fewest tokens; every expert of a --cpu-experts N layer).
  struct ChunkSplit {
    int resident = 0, copied = 0;
    std::vector<int> cpu;
  };
  ChunkSplit place_chunk(int layer, const std::vector<int>& order, const std::vector<std::vector<int>>& users) const;
  // Queues the chunk's input x [T, H] to the host (ahead of the GPU's experts, so that the CPU
  // need not wait for them), with room for `rows` rows of the CPU's output.
  void queue_chunk_input(const float* x, int T, size_t rows);
  // chunk_rows() = the unweighted rows of each of `experts` over its users in turn ([Σ users, H]),
  // from the host tier's records, once the input has come; returns the seconds it took.
  double compute_chunk(int layer, const std::vector<int>& experts, const std::vector<std::vector<int>>& users, int K);
  const float* chunk_rows() const { return chunk_rows_->floats(); }
  void record_chunk(int layer, const ChunkSplit& s, double cpu_s);

  // Pinned host memory for a layer's input [H], ids and weights [K] (the GPU writes them there),
  // and the CPU's rows [K, H].
  float* x_host() const { return io_.floats(); }
  int* ids_host() const { return reinterpret_cast<int*>(io_.floats() + hidden_); }
  float* weights_host() const { return io_.floats() + hidden_ + top_k_; }
  float* rows_host() const { return rows_.floats(); }

  // Waits on the host for the work queued on the compute stream so far (and only that: not the
  // copy stream's copies ahead).
  void wait_for_compute() {
    const auto start = std::chrono::steady_clock::now();
    mark_.record();
    mark_.wait();
    waited_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // rows_host()[k] = weight_k · expert(ids[k])(x) for each CPU slot k, from the host tier's
  // records; returns the seconds it took.
  double compute(int layer, const std::vector<int>& cpu_slots);

  // Timers of the GPU's side of the layer being decoded: its experts, then its wait for the CPU's rows.
  cuda::ComputeTimer& gpu_experts() { return gpu_experts_; }
  cuda::ComputeTimer& gpu_wait() { return gpu_wait_; }
  // After the host waited for the compute stream: the last layer's GPU times go to its
  // statistics and rates. Then this layer's counts and CPU time, read at the next.
  void settle();
  void record(int layer, const Split& s, double cpu_s);

 private:
  void measure_start_rates(const cuda::RecordMat (&proj)[3]);
  size_t copy_share(int layer, LayerMisses m) const;
  static void reserve(std::unique_ptr<cuda::PinnedBuffer>& b, size_t bytes);

  DeviceExpertStore& store_;
  CpuExperts mode_;
  int hidden_ = 0, top_k_ = 0;
  cuda::PinnedBuffer io_, rows_;
  cuda::ComputeTimer gpu_experts_, gpu_wait_;
  cuda::ComputeMark mark_;
  PlacementRates rates_;
  RateEstimate cpu_rate_, gpu_rate_;
  int pending_layer_ = -1, pending_gpu_ = 0;
  double waited_s_ = 0;  // the last wait_for_compute's
  // A prompt chunk's input [T, H] and the CPU's rows, pinned, grown as chunks ask; the input's
  // copy marked (its wait also finds the last chunk layer's rows uploaded: queued before it).
  std::unique_ptr<cuda::PinnedBuffer> chunk_x_, chunk_rows_;
  cuda::ComputeMark chunk_in_;
};

// Whether the hybrid decode takes experts of this layout: the integer product's (4 or 8 bits,
// groups of 32 to 128, bf16 or f16 scales) on both devices.
bool hybrid_layout(const cuda::RecordMat (&proj)[3]);

}  // namespace ms
