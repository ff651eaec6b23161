#pragma once
// The expert pool of the CUDA backend: per MoE layer a fixed set of VRAM slots (allocated at
// start, one buffer per layer), fed from the host tier below it. The host tier is an ExpertStore:
// with --host-cache a cache in host RAM with its own policy, without it staging slots that keep
// nothing. Either way its slots are registered with the driver, reads land there by io_uring +
// O_DIRECT and go on to VRAM with cudaMemcpyAsync on a copy stream.
//
// Where the pools stream and prefetch is on, experts predicted for a later layer (model/predict.h,
// on the GPU) that the host tier holds are copied into VRAM staging ahead of the router, and a
// staged expert is promoted into its pool (a copy on the device) only when routing asks for it;
// predicted experts the host tier lacks are handed to its own prefetch from disk.
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "experts/expert_store.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_memory.h"
#include "model/executor.h"

namespace ms {

class DeviceExpertStore final : public ExpertPrefetcher {
 public:
  // `vram`: slots, caps, pins, policy and prefetch of the VRAM pools (io options are the host
  // tier's); vram.prefetch.staging is the number of VRAM staging buffers (0: no prefetch). Layers
  // whose pool holds every expert are filled now. `host` must outlive this store. Statistics
  // (this store's and the host tier's) count from the end of the load.
  DeviceExpertStore(ExpertStore& host, const StoreOptions& vram);
  ~DeviceExpertStore() override;

  // Warm start: reads `hot[layer]` (best first) into the pools of the layers that stream, pinned
  // where `pin`. Statistics count from its end.
  void warm(const std::vector<std::vector<int>>& hot, bool pin);
  // Statistics (this store's and the host tier's) count from now: after the load, warm start or
  // the hybrid decode's measurements at start.
  void reset_stats();
  // What the load put in VRAM: the layers held whole (whole: every layer), pins, warm start.
  const TierLoad& load() const { return load_; }

  int capacity(int layer) const { return pools_[size_t(layer)]->capacity(); }
  int free_capacity(int layer) const { return capacity(layer) - pools_[size_t(layer)]->pinned(); }

  // As ExpertStore::acquire, returning device addresses of the records. A miss is published once
  // its copy is ordered before all later work of the compute stream. Where the layer misses some
  // and `before_copies` is given, it gets the addresses of the experts already in VRAM (null for
  // the misses) before the misses' copies are queued, so that the compute stream may take them
  // up while the copies run.
  using ResidentFirst = std::function<void(const std::vector<const uint8_t*>&)>;
  std::vector<const uint8_t*> acquire(int layer, const std::vector<int>& experts,
                                      const ResidentFirst& before_copies = {});
  void release(int layer);
  // Whether routing `expert` of `layer` now needs no copy from the host: it is in the layer's
  // pool, or in VRAM staging (a promotion on the device).
  bool in_vram(int layer, int expert) const;
  // The host tier's records of experts the CPU computes (the hybrid decode), after any copy ahead
  // from host memory is done; held until release_host(layer).
  std::vector<const uint8_t*> acquire_host(int layer, const std::vector<int>& experts);
  void release_host(int layer) { host_.release(layer); }
  // Counts where a decode step's experts of `layer` ran (LayerStats::placed).
  void add_placement(int layer, const PlacementStats& p);
  // The routed ids of a forward of `layer`: counted by the host tier for the usage history, so
  // that a GPU run warm-starts the next one as a CPU run does (ExpertStore::count_routes).
  void count_routes(int layer, const int* ids, int n) { host_.count_routes(layer, ids, n); }
  // For a layer whose pool holds every expert (filled at load, never evicted): a device array
  // of n_experts record addresses, so that the GPU finds routed experts without the host.
  // Null for a layer that streams.
  const uint8_t* const* resident_table(int layer) const { return tables_[size_t(layer)].data(); }

  // ExpertPrefetcher: VRAM staging, where prefetching().
  const EngineIndex& index() const override { return host_.index(); }
  const std::vector<int>& prefetch_targets(int source) const override { return schedule_.targets_of(source); }
  int prefetch_width() const override { return width_ ? width_->width() : 0; }
  void prefetch(int layer, const std::vector<int>& experts, int tokens) override;
  bool prefetching() const { return !staged_.empty(); }
  // How many of a layer's predicted misses (most likely first; `hits` predicted experts are in
  // VRAM) prefetch copies into VRAM: the hybrid decode's placement, which leaves the rest to the
  // CPU. Without one, all.
  using CopyShare = std::function<size_t(int layer, const std::vector<int>& misses, int hits)>;
  void set_copy_share(CopyShare share) { copy_share_ = std::move(share); }
  int staging_buffers() const { return int(staged_.size()); }
  size_t staging_bytes() const { return staging_.bytes(); }
  double mean_prefetch_width() const { return width_ ? width_->mean() : 0.0; }

  // The VRAM pools; bytes_read/read_s count the copies (demand and promotions; the times of the
  // last batch once the next is queued), stall_s the compute stream's wait for them, prefetch the
  // VRAM staging's counters.
  std::vector<LayerStats> stats() const;
  size_t resident_bytes() const;  // VRAM slots
  // Host-to-VRAM copy rate (pinned, one large copy) measured when the store was made, GB/s
  // (paced where StoreOptions::h2d_rate asked).
  double measured_h2d_gb_s() const { return h2d_gb_s_; }
  const ExpertStore& host() const { return host_; }
  ExpertStore& host_store() const { return host_; }
  // Whether some layer's VRAM pool holds fewer than all its experts (reads them as routed).
  bool streams() const {
    for (const auto& t : tables_)
      if (t.size() == 0) return true;
    return false;
  }

 private:
  struct Staged {
    int layer = -1, expert = -1;  // layer -1: free
    uint64_t stamp = 0;           // when it was staged: the oldest is dropped first
  };
  void pin(int layer, const std::vector<int>& experts, int top_k);
  void load_whole_layer(int layer);
  void fill(int layer, const std::vector<ExpertPool::Miss>& misses);
  void settle_batch();
  void settle_prefetch();
  void setup_prefetch(const StoreOptions& vram);
  void adapt_width();
  uint64_t bytes_copied() const;  // into the pools so far
  void measure_h2d();
  int find_staged(int layer, int expert) const;
  int take_staging(int* dropped_layer);
  uint8_t* staging_data(int buffer) const { return staging_.data() + size_t(buffer) * staging_stride_; }
  uint8_t* slot_data(int layer, int slot) const {
    return slots_[size_t(layer)].data() + size_t(slot) * host_.index().layers[size_t(layer)].stride;
  }

  ExpertStore& host_;
  int top_k_ = 1;
  // Whether a host record's memory stays put until this store's copies of it are done: the host
  // tier holds every expert and reads nothing ahead, so no read overwrites a slot. Then copies
  // are not waited for on the host (the compute stream waits for them), else each batch is.
  bool host_fixed_ = false;
  std::vector<cuda::HostRegistration> pinned_host_;
  std::vector<std::unique_ptr<ExpertPool>> pools_;  // bookkeeping; the bytes are in slots_
  // Taken with DeviceAlloc::Now: the copy stream fills the slots, the compute stream reads them.
  std::vector<cuda::DeviceArray<uint8_t>> slots_;
  std::vector<cuda::DeviceArray<const uint8_t*>> tables_;  // resident_table per layer, empty for a streamed one
  // Per layer, the compute that used its slots, marked at release(): what a refill waits for.
  std::vector<cuda::ComputeMark> released_;
  cuda::DeviceArray<uint8_t> staging_;  // VRAM staging for prefetch
  // Declared after every buffer it copies into: destroyed (waiting for its copies) first.
  cuda::CopyStream copy_;
  // The layer of the batch whose copies the host did not wait for (its times are counted when
  // settled, its bytes when queued), or -1.
  int unsettled_layer_ = -1;
  // Prefetch: what each VRAM staging buffer holds, the schedule, the counters and width.
  size_t staging_stride_ = 0;
  std::vector<Staged> staged_;
  uint64_t clock_ = 0;
  bool prefetch_in_flight_ = false;  // copies queued since the last mark() was seen done
  PrefetchSchedule schedule_;
  mutable std::mutex stats_mu_;  // prefetch_stats_, which stats() reads from other threads
  std::vector<PrefetchStats> prefetch_stats_;  // [expert layer]
  std::vector<PlacementStats> placed_;         // [expert layer]
  std::unique_ptr<WidthController> width_;
  CopyShare copy_share_;
  size_t predictions_ = 0;
  uint64_t window_misses_ = 0;  // demand copies since the width's last adaptation
  uint64_t behind_ = 0;         // demand batches queued behind prefetch copies
  TierLoad load_;
  double h2d_gb_s_ = 0;
};

}  // namespace ms
