#pragma once
// The expert pool of the CUDA backend: per MoE layer a fixed set of VRAM slots (allocated at
// start, one buffer per layer), fed from the host tier below it. The host tier is an ExpertStore:
// with --host-cache a cache in host RAM with its own policy, without it staging slots that keep
// nothing. Either way its slots are registered with the driver, reads land there by io_uring +
// O_DIRECT and go on to VRAM with cudaMemcpyAsync on a copy stream.
#include <memory>
#include <vector>

#include "experts/expert_store.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_memory.h"

namespace ms {

class DeviceExpertStore {
 public:
  // `vram`: slots, caps, pins and policy of the VRAM pools (io options are the host tier's).
  // Layers whose pool holds every expert are filled now. `host` must outlive this store.
  // Statistics (this store's and the host tier's) count from the end of the load.
  DeviceExpertStore(ExpertStore& host, const StoreOptions& vram);

  int capacity(int layer) const { return pools_[size_t(layer)]->capacity(); }
  int free_capacity(int layer) const { return capacity(layer) - pools_[size_t(layer)]->pinned(); }

  // As ExpertStore::acquire, returning device addresses of the records. A miss is published once
  // its copy is ordered before all later work of the compute stream.
  std::vector<const uint8_t*> acquire(int layer, const std::vector<int>& experts);
  void release(int layer);
  // For a layer whose pool holds every expert (filled at load, never evicted): a device array
  // of n_experts record addresses, so that the GPU finds routed experts without the host.
  // Null for a layer that streams.
  const uint8_t* const* resident_table(int layer) const { return tables_[size_t(layer)].data(); }

  std::vector<LayerStats> stats() const;  // the VRAM pools; bytes_read/read_s count the copies
  size_t resident_bytes() const;  // VRAM slots
  const ExpertStore& host() const { return host_; }
  ExpertStore& host_store() const { return host_; }
  // Whether some layer's VRAM pool holds fewer than all its experts (reads them as routed).
  bool streams() const {
    for (const auto& t : tables_)
      if (t.size() == 0) return true;
    return false;
  }

 private:
  void pin(int layer, const std::vector<int>& experts, int top_k);
  void load_whole_layer(int layer);
  void fill(int layer, const std::vector<ExpertPool::Miss>& misses);
  uint8_t* slot_data(int layer, int slot) const {
    return slots_[size_t(layer)].data() + size_t(slot) * host_.index().layers[size_t(layer)].stride;
  }

  ExpertStore& host_;
  std::vector<cuda::HostRegistration> pinned_host_;
  std::vector<std::unique_ptr<ExpertPool>> pools_;  // bookkeeping; the bytes are in slots_
  // Taken with DeviceAlloc::Now: the copy stream fills the slots, the compute stream reads them.
  std::vector<cuda::DeviceArray<uint8_t>> slots_;
  std::vector<cuda::DeviceArray<const uint8_t*>> tables_;  // resident_table per layer, empty for a streamed one
  // Per layer, the compute that used its slots, marked at release(): what a refill waits for.
  std::vector<cuda::ComputeMark> released_;
  cuda::CopyStream copy_;
};

}  // namespace ms
