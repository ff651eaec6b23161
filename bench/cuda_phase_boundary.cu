// What a dependent step costs between two GPU phases of a decode step, as one kernel per phase
// (the engine's design: launched overlapped, in a CUDA graph) against one persistent kernel that
// runs every phase with a grid-wide barrier between them. Each phase is a matvec's memory
// traffic without its arithmetic: every block reads its share of S bytes of weights (a fresh
// copy each phase, cycled over far more than the L2 holds) and all of the vector x that the
// phase before wrote (16 KB, from the L2), and writes its share of the next x. Two forms:
//   kernels     one kernel a phase, waiting (griddepcontrol.wait) before it reads anything
//   persistent  one kernel, a barrier between phases, each phase's loads after its barrier
// and each of them early: a thread's first 128 bytes of the phase's weights (which no phase
// writes) loaded into registers before the wait or the barrier, so that their latency overlaps it,
// and the kernels early once more with the next kernel let launch as soon as this one begins
// ("+ trigger first"), so that its early loads overlap this one's work. Beside them the floor of
// bench_cuda_matvec: the same bytes read by the simplest streaming kernel, in a graph. Times are
// microseconds a phase (medians of 5 runs of 64 phases).
//
//   build/bench/bench_cuda_phase_boundary
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream.h"
#include "stream_read.h"

using namespace ms;

namespace {

constexpr int kThreads = 512;
constexpr int kPhases = 64;
constexpr int kX = 4096;        // floats of x
constexpr int kEarlyLoads = 8;  // 16-byte loads a thread holds across the wait or the barrier
constexpr int kUnroll = 4;      // 16-byte loads a thread has in flight otherwise
constexpr size_t kWorkingSet = size_t(1) << 30;

struct Phases {
  const uint4* w;  // copies of S bytes, phase p reads copy p % copies
  size_t w_words;  // uint4s of one copy
  int copies;
  float* x[2];        // phase p reads x[p % 2], writes x[(p + 1) % 2]
  unsigned* barrier;  // [0] arrivals (only grows), [1] barriers passed
};

// Phase p's copy of the weights; thread i of the grid reads words i, i + grid threads, ...
__device__ __forceinline__ const uint4* phase_weights(const Phases& ph, int p) {
  return ph.w + size_t(p % ph.copies) * ph.w_words;
}

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

__device__ __forceinline__ size_t first_word() { return size_t(blockIdx.x) * kThreads + threadIdx.x; }

// The rest of a phase once its weights up to `from` (a thread's first loads) are folded into acc:
// the remaining weights, all of x (through the L2: another block wrote it), and this block's share
// of the next x.
__device__ void finish_phase(const Phases& ph, int p, size_t from, uint32_t acc) {
  const uint4* w = phase_weights(ph, p);
  const size_t stride = size_t(gridDim.x) * kThreads;
  size_t i = from;
  for (; i + (kUnroll - 1) * stride < ph.w_words; i += kUnroll * stride) {  // as bench::stream_read
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(w + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= fold(v[u]);
  }
  for (; i < ph.w_words; i += stride) acc ^= fold(__ldcs(w + i));
  const float4* x = reinterpret_cast<const float4*>(ph.x[p % 2]);
  float sum = 0.f;
  for (int j = threadIdx.x; j < kX / 4; j += kThreads) {
    const float4 v = __ldcg(x + j);
    sum += v.x + v.y + v.z + v.w;
  }
  const int per_block = (kX + gridDim.x - 1) / gridDim.x, out = blockIdx.x * per_block + threadIdx.x;
  if (threadIdx.x < per_block && out < kX) ph.x[(p + 1) % 2][out] = sum * 1e-30f + float(acc & 1u);
}

// A thread's first kEarlyLoads words of phase p's weights (zeros past the end), folded: the loads
// are in flight from here until the fold uses them.
struct EarlyWords {
  uint4 w[kEarlyLoads];

  __device__ __forceinline__ EarlyWords(const Phases& ph, int p) {
    const uint4* src = phase_weights(ph, p);
    const size_t stride = size_t(gridDim.x) * kThreads, from = first_word();
#pragma unroll
    for (int k = 0; k < kEarlyLoads; ++k)
      w[k] = from + k * stride < ph.w_words ? __ldcs(src + from + k * stride) : uint4{};
  }
  __device__ __forceinline__ uint32_t fold_all() const {
    uint32_t acc = 0;
#pragma unroll
    for (int k = 0; k < kEarlyLoads; ++k) acc ^= fold(w[k]);
    return acc;
  }
  __device__ __forceinline__ static size_t next_word() {
    return first_word() + size_t(kEarlyLoads) * gridDim.x * kThreads;
  }
};

// With TRIGGER_FIRST the next phase's kernel may launch as soon as every block of this one has
// begun (else once each has done its work), so that its early loads overlap this one's.
template <bool EARLY, bool TRIGGER_FIRST = false>
__global__ void __launch_bounds__(kThreads) phase_kernel(Phases ph, int p) {
  if (TRIGGER_FIRST) cuda::grid_dependents_may_start();
  if (EARLY) {
    const EarlyWords early(ph, p);
    cuda::grid_dependency_wait();
    finish_phase(ph, p, EarlyWords::next_word(), early.fold_all());
  } else {
    cuda::grid_dependency_wait();
    finish_phase(ph, p, first_word(), 0);
  }
  if (!TRIGGER_FIRST) cuda::grid_dependents_may_start();
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block waits until all have arrived: thread 0 of each adds its arrival to a count that only
// grows (release: the block's writes before it, which the barrier before it ordered), the last of
// a round (count (gen + 1)·blocks) publishes the generation and the others spin on it (acquire).
__device__ void grid_barrier(unsigned* b, unsigned& gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(b) : "memory");
    if (old == (gen + 1) * gridDim.x - 1) {
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(b + 1), "r"(gen + 1) : "memory");
    } else {
      while (load_acquire(&b[1]) == gen) {
      }
    }
  }
  ++gen;
  __syncthreads();
}

template <bool EARLY>
__global__ void __launch_bounds__(kThreads) persistent_kernel(Phases ph) {
  unsigned gen = load_acquire(&ph.barrier[1]);
  for (int p = 0; p < kPhases; ++p) {
    if (EARLY) {
      const EarlyWords early(ph, p);
      if (p > 0) grid_barrier(ph.barrier, gen);
      finish_phase(ph, p, EarlyWords::next_word(), early.fold_all());
    } else {
      if (p > 0) grid_barrier(ph.barrier, gen);
      finish_phase(ph, p, first_word(), 0);
    }
  }
}

// One persistent launch of kPhases phases on `blocks` blocks, after the barrier's words were zeroed.
template <bool EARLY>
double persistent_ms(const Phases& ph, int blocks) {
  CUDA_CHECK(cudaMemset(ph.barrier, 0, 2 * sizeof(unsigned)));
  void* args[] = {const_cast<Phases*>(&ph)};
  return bench::median_ms([&] {
    CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(persistent_kernel<EARLY>),
                                           dim3(unsigned(blocks)), dim3(kThreads), args, 0, cuda::compute_stream()));
  });
}

// kPhases launches of `launch(p)` captured into one graph, as a decode step runs its kernels.
template <class F>
double graph_ms(F&& launch) {
  cuda::Graph graph;
  graph.begin_capture();
  for (int p = 0; p < kPhases; ++p) launch(p);
  graph.end_capture();
  return bench::median_ms([&] { graph.launch(); });
}

void run(size_t bytes, int sms, int max_per_sm, double copy_gbps) {
  const size_t words = bytes / 16;
  const int copies = int(std::max<size_t>(2, kWorkingSet / bytes));
  const cuda::DeviceAlloc now = cuda::DeviceAlloc::Now;
  cuda::DeviceArray<uint4> w(words * size_t(copies), now);  // copies of `words` 16-byte words
  cuda::DeviceArray<float> x(2 * kX, now);
  cuda::DeviceArray<unsigned> barrier(2, now);
  cuda::DeviceArray<uint32_t> sink(1, now);
  CUDA_CHECK(cudaMemset(w.data(), 0x5a, w.bytes()));
  CUDA_CHECK(cudaMemset(x.data(), 0, x.bytes()));
  const Phases ph{w.data(), words, copies, {x.data(), x.data() + kX}, barrier.data()};

  static cuda::KernelLimits lim;
  const int resident = cuda::resident_blocks(phase_kernel<false>, kThreads, 0, lim, "phase_kernel", 0);
  const int grid = int(std::min<size_t>(size_t(resident), (words + kThreads - 1) / kThreads));
  auto kernels_ms = [&](auto kernel) {
    return graph_ms(
        [&](int p) { cuda::launch_overlapped(kernel, lim.overlap, dim3(unsigned(grid)), kThreads, 0, ph, p); });
  };
  const double kernels = kernels_ms(phase_kernel<false>), kernels_early = kernels_ms(phase_kernel<true>),
               early_triggered = kernels_ms(phase_kernel<true, true>);
  const double floor = graph_ms([&](int p) {
    bench::stream_read(w.data() + size_t(p % copies) * words, words * 16, sink.data());
  });
  auto column = [&](const char* what, double ms) {
    const double us = ms * 1e3 / kPhases;
    std::printf(" | %s %6.2f us %5.1f%%", what, us, 100.0 * double(bytes) / (us * 1e3) / copy_gbps);
  };
  std::printf("%6.2f MB", double(bytes) / 1e6);
  column("kernels", kernels);
  column("early", kernels_early);
  column("+ trigger first", early_triggered);
  for (int per_sm = 1; per_sm <= std::min(2, max_per_sm); ++per_sm) {
    std::printf(" | %d a SM:", per_sm);
    column("persistent", persistent_ms<false>(ph, per_sm * sms));
    column("early", persistent_ms<true>(ph, per_sm * sms));
  }
  column("stream read", floor);
  std::printf(" of copy\n");
}

}  // namespace

int main() {
  if (!cuda::cuda_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  if (!cuda::device_attribute(cudaDevAttrCooperativeLaunch)) {
    std::printf("the device cannot launch cooperative kernels\n");
    return 0;
  }
  const int sms = cuda::device_attribute(cudaDevAttrMultiProcessorCount);
  int per_sm = 0;  // the persistent forms' blocks must all be resident: a cooperative launch checks it
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel<true>, kThreads, 0));
  const double copy = bench::copy_gbps();
  std::printf(
      "%d SMs, device-to-device copy %.0f GB/s (read + write); %d phases, x %d KB, early: %d bytes a thread "
      "held across the wait or the barrier; us a phase and %% of the copy rate\n",
      sms, copy, kPhases, int(kX * sizeof(float) / 1024), kEarlyLoads * 16);
  for (double mb : {0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0}) run(size_t(mb * 1024 * 1024), sms, per_sm, copy);
}
