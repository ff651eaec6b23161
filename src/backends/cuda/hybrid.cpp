#include "backends/cuda/hybrid.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/cpu/int_expert.h"
#include "kernels/cuda/int_gemm.h"
#include "util/error.h"

namespace ms {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

QuantMat host_mat(const ProjLayout& p, const uint8_t* record) {
  return {record + p.q_offset, reinterpret_cast<const uint16_t*>(record + p.scales_offset),
          reinterpret_cast<const uint16_t*>(record + p.biases_offset), p.rows, p.cols, p.bits, p.group, p.scale_type};
}

// A layer input of ordinary magnitudes for the measurements at start.
std::vector<float> probe_input(int n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[size_t(i)] = std::sin(0.37f * float(i)) * 0.5f;
  return x;
}

}  // namespace

bool hybrid_layout(const cuda::RecordMat (&proj)[3]) { return cuda::int_records_layout(proj); }

HybridExperts::HybridExperts(DeviceExpertStore& store, const CpuExperts& mode, const cuda::RecordMat (&proj)[3],
                             int top_k, bool measure)
    : store_(store),
      mode_(mode),
      hidden_(proj[0].cols),
      top_k_(top_k),
      io_((size_t(hidden_) + 2 * size_t(top_k)) * sizeof(float)),
      rows_(size_t(top_k) * size_t(hidden_) * sizeof(float)) {
  if (!measure) return;
  measure_start_rates(proj);
  store_.reset_stats();
}

std::string HybridExperts::describe() const {
  return fmt::format("{}; rates: copy {:.1f} GB/s, an expert {:.1f} us on the GPU and {:.1f} us on the CPU (+{:.1f} us "
                     "a further token of a prompt chunk), round trip {:.1f} us",
                     ms::describe(mode_), rates_.h2d_bytes_per_s / 1e9, rates_.gpu_expert_s * 1e6,
                     rates_.cpu_expert_s * 1e6, rates_.cpu_token_s * 1e6, rates_.cpu_round_trip_s * 1e6);
}

// Each rate the fastest of a few runs after a first that warms caches and mappings.
void HybridExperts::measure_start_rates(const cuda::RecordMat (&proj)[3]) {
  constexpr int kRuns = 4;
  rates_.h2d_bytes_per_s = store_.measured_h2d_gb_s() * 1e9;
  const std::vector<float> x = probe_input(hidden_);
  std::copy(x.begin(), x.end(), x_host());
  // The CPU: expert 0 of the first layer from the host tier.
  {
    const std::vector<const uint8_t*> rec = store_.acquire_host(0, {0});
    const ExpertLayer& l = store_.index().layers.front();
    const QuantMat gate = host_mat(l.proj[0], rec[0]), up = host_mat(l.proj[1], rec[0]), down = host_mat(l.proj[2], rec[0]);
    // One token (a decode step's), then a prompt chunk's kChunkTokens: the further tokens' cost.
    constexpr int kChunkTokens = 16;
    const std::vector<float> xs = probe_input(kChunkTokens * hidden_);
    std::vector<float> ys(xs.size());
    double best = 1e30, best_chunk = 1e30;
    try {
      for (int r = 0; r < kRuns; ++r) {
        auto t = std::chrono::steady_clock::now();
        cpu::int_expert(x_host(), gate, up, down, 1.f, rows_host());
        if (r > 0) best = std::min(best, seconds_since(t));
        t = std::chrono::steady_clock::now();
        cpu::int_expert_tokens(xs.data(), kChunkTokens, gate, up, down, ys.data());
        if (r > 0) best_chunk = std::min(best_chunk, seconds_since(t));
      }
    } catch (...) {
      store_.release_host(0);
      throw;
    }
    store_.release_host(0);
    rates_.cpu_expert_s = best;
    rates_.cpu_token_s = std::max(0.0, (best_chunk - best) / (kChunkTokens - 1));
  }
  // The GPU: top_k experts of the first layer from VRAM.
  {
    std::vector<int> ids;
    for (int e = 0; e < std::min(top_k_, store_.index().layers.front().n_experts); ++e) ids.push_back(e);
    const std::vector<const uint8_t*> rec = store_.acquire(0, ids);
    const auto records = cuda::DeviceArray<const uint8_t*>::from(rec, cuda::DeviceAlloc::Now);
    const auto weights = cuda::DeviceArray<float>::from(std::vector<float>(ids.size(), 1.f), cuda::DeviceAlloc::Now);
    const auto dx = cuda::DeviceArray<float>::from(x, cuda::DeviceAlloc::Now);
    cuda::DeviceArray<float> partial(ids.size() * size_t(hidden_), cuda::DeviceAlloc::Now);
    cuda::DeviceArray<uint8_t> scratch(cuda::int_records_scratch_bytes(int(ids.size()), proj), cuda::DeviceAlloc::Now);
    double best = 1e30;
    for (int r = 0; r < kRuns; ++r) {
      gpu_experts_.start();
      cuda::int_expert_records(dx.data(), int(ids.size()), records.data(), weights.data(), proj, partial.data(),
                               scratch.data());
      gpu_experts_.stop();
      const double s = gpu_experts_.take_elapsed_s();
      if (r > 0) best = std::min(best, s);
    }
    store_.release(0);
    cuda::synchronize();
    rates_.gpu_expert_s = best / double(ids.size());
    // The round trip: the input down, a row back up.
    best = 1e30;
    for (int r = 0; r < kRuns; ++r) {
      const auto t = std::chrono::steady_clock::now();
      cuda::copy_to_host_async(x_host(), dx.data(), size_t(hidden_) * sizeof(float));
      cuda::copy_to_device_async(partial.data(), rows_host(), size_t(hidden_) * sizeof(float));
      cuda::synchronize();
      if (r > 0) best = std::min(best, seconds_since(t));
    }
    rates_.cpu_round_trip_s = best;
  }
  cpu_rate_ = RateEstimate(rates_.cpu_expert_s);
  gpu_rate_ = RateEstimate(rates_.gpu_expert_s);
}

HybridExperts::Split HybridExperts::place(int layer, const int* ids, int K) const {
  Split s;
  if (mode_.static_cpu(layer)) {  // --cpu-experts N: every expert of the layer on the CPU
    for (int k = 0; k < K; ++k) s.cpu_slots.push_back(k);
    return s;
  }
  std::vector<int> misses, miss_ids;  // slots, in routing order (the heaviest first: most worth keeping)
  for (int k = 0; k < K; ++k) (store_.in_vram(layer, ids[k]) ? s.gpu_slots : misses).push_back(k);
  for (int k : misses) miss_ids.push_back(ids[k]);
  const size_t n_copy = copy_share(layer, miss_ids, int(s.gpu_slots.size()));
  s.copied = int(n_copy);
  s.gpu_slots.insert(s.gpu_slots.end(), misses.begin(), misses.begin() + std::ptrdiff_t(n_copy));
  s.cpu_slots.assign(misses.begin() + std::ptrdiff_t(n_copy), misses.end());
  return s;
}

size_t HybridExperts::copy_share(int layer, const std::vector<int>& misses, int resident) const {
  return copy_share(layer, {.experts = misses, .resident = resident});
}

size_t HybridExperts::copy_share(int layer, LayerMisses m) const {
  if (mode_.static_cpu(layer)) return 0;
  if (mode_.mode != CpuExperts::Mode::Auto || m.experts.empty()) return m.experts.size();
  m.record_bytes = store_.index().layers[size_t(layer)].stride;
  return place_misses(m, rates_).copy.size();
}

HybridExperts::ChunkSplit HybridExperts::place_chunk(int layer, const std::vector<int>& order,
                                                     const std::vector<std::vector<int>>& users) const {
  ChunkSplit s;
  if (mode_.static_cpu(layer)) {
    s.cpu = order;
    return s;
  }
  std::vector<int> misses;
  for (int e : order)
    if (store_.in_vram(layer, e)) ++s.resident;
    else misses.push_back(e);
  // Those serving the most tokens first: the most worth a copy.
  std::stable_sort(misses.begin(), misses.end(),
                   [&](int a, int b) { return users[size_t(a)].size() > users[size_t(b)].size(); });
  LayerMisses m{.experts = misses, .resident = s.resident, .row_bytes = size_t(hidden_) * sizeof(float)};
  for (int e : misses) m.users.push_back(int(users[size_t(e)].size()));
  const size_t n_copy = copy_share(layer, std::move(m));
  s.copied = int(n_copy);
  s.cpu.assign(misses.begin() + std::ptrdiff_t(n_copy), misses.end());
  return s;
}

void HybridExperts::reserve(std::unique_ptr<cuda::PinnedBuffer>& b, size_t bytes) {
  if (!b || b->bytes() < bytes) b = std::make_unique<cuda::PinnedBuffer>(bytes);
}

void HybridExperts::queue_chunk_input(const float* x, int T, size_t rows) {
  const size_t row = size_t(hidden_) * sizeof(float);
  const bool grow = (chunk_x_ && chunk_x_->bytes() < size_t(T) * row) || (chunk_rows_ && chunk_rows_->bytes() < rows * row);
  if (grow) {  // no copy into or out of the old buffers may be in flight
    chunk_in_.record();
    chunk_in_.wait();
  }
  reserve(chunk_x_, size_t(T) * row);
  reserve(chunk_rows_, rows * row);
  cuda::copy_to_host_async(chunk_x_->floats(), x, size_t(T) * row);
  chunk_in_.record();
}

double HybridExperts::compute_chunk(int layer, const std::vector<int>& experts, const std::vector<std::vector<int>>& users,
                                    int K) {
  chunk_in_.wait();  // the chunk's input (by now mostly come: it was queued before the GPU's experts)
  const auto start = std::chrono::steady_clock::now();
  const ExpertLayer& l = store_.index().layers[size_t(layer)];
  const size_t H = size_t(hidden_);
  // In waves the host tier can hold at once (its staging may keep fewer than a chunk's experts).
  const size_t wave = size_t(std::max(1, store_.host().free_capacity(layer)));
  thread_local std::vector<float> gathered;
  float* rows = chunk_rows_->floats();
  for (size_t first = 0; first < experts.size(); first += wave) {
    const std::vector<int> ids(experts.begin() + std::ptrdiff_t(first),
                               experts.begin() + std::ptrdiff_t(std::min(experts.size(), first + wave)));
    const std::vector<const uint8_t*> records = store_.acquire_host(layer, ids);
    try {
      for (size_t i = 0; i < ids.size(); ++i) {
        const std::vector<int>& u = users[size_t(ids[i])];
        gathered.resize(u.size() * H);
        for (size_t j = 0; j < u.size(); ++j)
          std::copy_n(chunk_x_->floats() + size_t(u[j] / K) * H, H, gathered.data() + j * H);
        cpu::int_expert_tokens(gathered.data(), int(u.size()), host_mat(l.proj[0], records[i]),
                               host_mat(l.proj[1], records[i]), host_mat(l.proj[2], records[i]), rows);
        rows += u.size() * H;
      }
    } catch (...) {
      store_.release_host(layer);
      throw;
    }
    store_.release_host(layer);
  }
  return seconds_since(start);
}

void HybridExperts::record_chunk(int layer, const ChunkSplit& s, double cpu_s) {
  store_.add_placement(layer, {.gpu = uint64_t(s.resident), .copied = uint64_t(s.copied), .cpu = uint64_t(s.cpu.size()),
                               .cpu_busy_s = cpu_s});
}

double HybridExperts::compute(int layer, const std::vector<int>& cpu_slots) {
  if (cpu_slots.empty()) return 0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> ids;
  for (int k : cpu_slots) ids.push_back(ids_host()[k]);
  const std::vector<const uint8_t*> records = store_.acquire_host(layer, ids);
  const ExpertLayer& l = store_.index().layers[size_t(layer)];
  std::vector<cpu::IntExpertJob> jobs;
  for (size_t i = 0; i < cpu_slots.size(); ++i) {
    const int k = cpu_slots[i];
    jobs.push_back({host_mat(l.proj[0], records[i]), host_mat(l.proj[1], records[i]), host_mat(l.proj[2], records[i]),
                    weights_host()[k], rows_host() + size_t(k) * size_t(hidden_)});
  }
  try {
    cpu::int_experts(x_host(), jobs);
  } catch (...) {
    store_.release_host(layer);
    throw;
  }
  store_.release_host(layer);
  return seconds_since(start);
}

void HybridExperts::settle() {
  if (pending_layer_ < 0) return;
  const double gpu_s = gpu_experts_.take_elapsed_s(), wait_s = gpu_wait_.take_elapsed_s();
  if (pending_gpu_ > 0) gpu_rate_.add(gpu_s / double(pending_gpu_));
  rates_.gpu_expert_s = gpu_rate_.value();
  store_.add_placement(pending_layer_, {.gpu_wait_s = wait_s});
  pending_layer_ = -1;
}

void HybridExperts::record(int layer, const Split& s, double cpu_s) {
  const int gpu = int(s.gpu_slots.size()) - s.copied;
  store_.add_placement(layer, {.gpu = uint64_t(gpu), .copied = uint64_t(s.copied), .cpu = uint64_t(s.cpu_slots.size()),
                               .cpu_busy_s = cpu_s, .cpu_wait_s = waited_s_});
  if (!s.cpu_slots.empty()) cpu_rate_.add(cpu_s / double(s.cpu_slots.size()));
  rates_.cpu_expert_s = cpu_rate_.value();
  pending_layer_ = layer;
  pending_gpu_ = int(s.gpu_slots.size());
}

}  // namespace ms
