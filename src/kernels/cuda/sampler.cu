// Sampling on the GPU, step for step as runtime/sampler.cpp: penalties on a copy of the logits,
// then either the argmax or the candidates sorted by logit (CUB's radix sort: stable, so ties
// keep the lower index first), their softmax in double, the min-p and top-p cuts and the walk
// of the draw. Float arithmetic uses the _rn intrinsics where nvcc would otherwise fuse a
// multiply and an add into an FMA that the CPU does not do.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cub/cub.cuh>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/ops.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;  // elementwise kernels
constexpr int kBlock = 1024;   // the one block of the sampling's finish (finish_kernel)

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

__global__ void iota_kernel(int* x, int n) {
  const int i = int(blockIdx.x) * kThreads + int(threadIdx.x);
  if (i < n) x[i] = i;
}

// x (a copy of the logits) gets the CPU's penalties per distinct seen token, in float.
__global__ void penalize_kernel(float* x, const int* tokens, const int* counts, int n, int vocab, SampleArgs a) {
  const int j = int(blockIdx.x) * kThreads + int(threadIdx.x);
  if (j >= n || tokens[j] < 0 || tokens[j] >= vocab) return;
  float l = x[tokens[j]];
  if (a.repetition_penalty != 1.f) l = l > 0 ? __fdiv_rn(l, a.repetition_penalty) : __fmul_rn(l, a.repetition_penalty);
  x[tokens[j]] = __fsub_rn(l, __fadd_rn(a.presence_penalty, __fmul_rn(a.frequency_penalty, float(counts[j]))));
}

struct Best {
  float v;
  int i;
};

// The larger value, ties to the lower index: std::max_element's first maximum.
__device__ Best better(Best a, Best b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

struct BetterOp {
  __device__ Best operator()(Best a, Best b) const { return better(a, b); }
};

struct MinOp {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};

// Blocks of the argmax, each over a strided share of the vocabulary: about one a multiprocessor,
// faster than one block of 1024 threads (docs/PERFORMANCE.md#cuda-sampler).
constexpr int kArgmaxBlocks = 128, kArgmaxThreads = 256;

// *token = the index of the first maximum of x[0..n) (NaNs never win, unless x[0] is one: then 0,
// as std::max_element). Each block writes its best to partial[]; the last block to finish (the
// count in *done, which it sets back to 0) reduces them. better() is a total order on what the
// blocks find, so the result does not depend on which block is last.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* x, int n, Best* partial, unsigned* done,
                                                                int* token) {
  start_after_kernel_before();  // launched by launch_after
  using Reduce = cub::BlockReduce<Best, kArgmaxThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ bool last;
  Best b{x[0], 0};
  for (int i = int(blockIdx.x * kArgmaxThreads + threadIdx.x); i < n; i += int(gridDim.x) * kArgmaxThreads)
    b = better(b, Best{x[i], i});
  b = Reduce(tmp).Reduce(b, BetterOp());
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = b;
    __threadfence();  // the best is visible before the count says so
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  b = Best{x[0], 0};
  for (int j = int(threadIdx.x); j < int(gridDim.x); j += kArgmaxThreads) {
    const int2 v = __ldcg(reinterpret_cast<const int2*>(partial) + j);  // past the L1: other blocks wrote it
    b = better(b, Best{__int_as_float(v.x), v.y});
  }
  b = Reduce(tmp).Reduce(b, BetterOp());
  if (threadIdx.x == 0) *token = b.i, *done = 0;
}

// p[i] = exp((l_i - max) / temperature) over the k candidates, the logits sorted descending.
__global__ void softmax_terms_kernel(const float* sorted, int k, float temperature, double* p) {
  const int i = int(blockIdx.x) * kThreads + int(threadIdx.x);
  if (i < k) p[i] = exp((double(sorted[i]) - double(sorted[0])) / double(temperature));
}

// The rest of Sampler::sample in one block. Thread t owns the candidates [b, e), a contiguous
// chunk, and sums them in order; the chunk sums are combined by a block scan. Each search (first
// candidate under min-p, first prefix reaching top-p, where the draw falls) is a walk per chunk
// and the minimum index found.
class Finisher {
  using Scan = cub::BlockScan<double, kBlock>;
  using MinReduce = cub::BlockReduce<int, kBlock>;

 public:
  union Shared {
    typename Scan::TempStorage scan;
    typename MinReduce::TempStorage reduce;
    int result;
  };

  __device__ Finisher(double* p, int k, Shared& shared)
      : p_(p), b_(min(k, int(threadIdx.x) * chunk(k))), e_(min(k, b_ + chunk(k))), tmp_(shared) {}

  // p /= their sum.
  __device__ void normalize() {
    double total;
    prefix_sum(e_, &total);
    for (int i = b_; i < e_; ++i) p_[i] = __ddiv_rn(p_[i], total);
    __syncthreads();  // p[0], in thread 0's chunk, is read by all
  }

  // The first i < end with p[i] < cut, or INT_MAX.
  __device__ int first_below(double cut, int end) {
    int found = INT_MAX;
    for (int i = b_; i < min(e_, end); ++i)
      if (p_[i] < cut) {
        found = i;
        break;
      }
    return block_min(found);
  }

  // The first i < end with p[0] + ... + p[i] >= mass, or INT_MAX.
  __device__ int first_reaching(double mass, int end) {
    double m = prefix_sum(end, nullptr);
    int found = INT_MAX;
    for (int i = b_; i < min(e_, end); ++i)
      if ((m += p_[i]) >= mass) {
        found = i;
        break;
      }
    return block_min(found);
  }

  // The first i < end where u - p[0] - ... - p[i] < 0 for u = r * (p[0] + ... + p[end-1]), or
  // INT_MAX.
  __device__ int draw(double r, int end) {
    double total;
    const double before = prefix_sum(end, &total);
    double u = __dsub_rn(__dmul_rn(r, total), before);
    int found = INT_MAX;
    for (int i = b_; i < min(e_, end); ++i)
      if ((u -= p_[i]) < 0) {
        found = i;
        break;
      }
    return block_min(found);
  }

 private:
  static __device__ int chunk(int k) { return (k + kBlock - 1) / kBlock; }

  // The sum of p[0 .. b) (this thread's chunk's start, capped at end); *total gets p[0 .. end).
  __device__ double prefix_sum(int end, double* total) {
    double s = 0;
    for (int i = b_; i < min(e_, end); ++i) s += p_[i];
    double before, all;
    Scan(tmp_.scan).ExclusiveSum(s, before, all);
    __syncthreads();  // before tmp_ is reused
    if (total) *total = all;
    return before;
  }

  __device__ int block_min(int v) {
    v = MinReduce(tmp_.reduce).Reduce(v, MinOp());
    __syncthreads();  // every thread is done with tmp_.reduce
    if (threadIdx.x == 0) tmp_.result = v;
    __syncthreads();
    const int out = tmp_.result;
    __syncthreads();  // before tmp_ is reused
    return out;
  }

  double* p_;
  int b_, e_;
  Shared& tmp_;
};

// Launch bounds: 1024 threads leave 64 registers each, fewer than this kernel takes unbounded.
__global__ void __launch_bounds__(kBlock) finish_kernel(double* p, const int* order, int k, SampleArgs a, double r, int* token) {
  __shared__ Finisher::Shared shared;
  Finisher f(p, k, shared);
  f.normalize();
  int keep = k;
  if (a.min_p > 0.f)  // tokens less likely than min_p times the most likely one
    keep = min(keep, f.first_below(__dmul_rn(double(a.min_p), p[0]), keep));
  if (a.top_p < 1.f) {  // the smallest prefix whose mass reaches top_p
    const int last = f.first_reaching(double(a.top_p), keep);
    if (last != INT_MAX) keep = last + 1;
  }
  keep = max(1, keep);
  const int i = f.draw(r, keep);
  if (threadIdx.x == 0) *token = order[i == INT_MAX ? keep - 1 : i];
}

}  // namespace

// Buffers for a vocabulary; the ids 0..vocab-1 once, as the sort's input values.
void fit_workspace(SamplerWorkspace& ws, int vocab) {
  if (ws.vocab == vocab) return;
  const size_t n = size_t(vocab);
  ws.penalized = DeviceArray<float>(n, DeviceAlloc::Now);
  ws.sorted = DeviceArray<float>(n, DeviceAlloc::Now);
  ws.ids = DeviceArray<int>(n, DeviceAlloc::Now);
  ws.order = DeviceArray<int>(n, DeviceAlloc::Now);
  ws.probs = DeviceArray<double>(n, DeviceAlloc::Now);
  ws.token = DeviceArray<int>(1, DeviceAlloc::Now);
  ws.argmax_partial = DeviceArray<unsigned char>(kArgmaxBlocks * sizeof(Best), DeviceAlloc::Now);
  ws.argmax_done = DeviceArray<unsigned>(1, DeviceAlloc::Now);
  CUDA_CHECK(cudaMemsetAsync(ws.argmax_done.data(), 0, sizeof(unsigned), compute_stream()));
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, ws.penalized.data(), ws.sorted.data(),
                                                       ws.ids.data(), ws.order.data(), vocab));
  ws.cub_temp = DeviceArray<unsigned char>(bytes, DeviceAlloc::Now);
  iota_kernel<<<blocks_for(vocab), kThreads, 0, compute_stream()>>>(ws.ids.data(), vocab);
  CUDA_CHECK_LAUNCH();
  ws.vocab = vocab;
}

namespace {

void launch_argmax(const float* x, int vocab, SamplerWorkspace& ws, int* token) {
  const int blocks = std::min(kArgmaxBlocks, (vocab + kArgmaxThreads - 1) / kArgmaxThreads);
  launch_after(argmax_kernel, unsigned(blocks), kArgmaxThreads, 0, x, vocab,
               reinterpret_cast<Best*>(ws.argmax_partial.data()), ws.argmax_done.data(), token);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void greedy_token(const float* logits, int vocab, SamplerWorkspace& ws, int* token) {
  if (vocab <= 0 || ws.vocab != vocab)
    arg_fail("cuda::greedy_token: vocab " + std::to_string(vocab) + " and a workspace fitted to " +
             std::to_string(ws.vocab) + " (fit_workspace)");
  launch_argmax(logits, vocab, ws, token);
}

int pick(const float* logits, int vocab, const PickInputs& in, SamplerWorkspace& ws) {
  std::vector<int> staged = in.tokens;  // the distinct seen tokens, then their counts
  staged.insert(staged.end(), in.counts.begin(), in.counts.end());
  if (ws.staging.size() < staged.size()) ws.staging = DeviceArray<int>(staged.size(), DeviceAlloc::Now);
  if (!staged.empty()) ws.staging.upload(staged.data(), staged.size());
  const int* tokens = ws.staging.data();
  const int n = int(in.tokens.size());
  return sample(logits, vocab, tokens, tokens + n, n, in.args, in.r, ws);
}

int sample(const float* logits, int vocab, const int* penalty_tokens, const int* penalty_counts, int n_penalty,
           const SampleArgs& a, double r, SamplerWorkspace& ws) {
  if (vocab <= 0) arg_fail("cuda::sample: vocab " + std::to_string(vocab) + "; must be > 0");
  if (a.top_k < 0) arg_fail("cuda::sample: top_k " + std::to_string(a.top_k) + "; must be >= 0");
  fit_workspace(ws, vocab);
  const float* x = logits;
  if (n_penalty > 0) {  // on a copy: the logits are not modified
    float* penalized = ws.penalized.data();
    CUDA_CHECK(cudaMemcpyAsync(penalized, logits, size_t(vocab) * sizeof(float), cudaMemcpyDeviceToDevice, compute_stream()));
    x = penalized;
    penalize_kernel<<<blocks_for(n_penalty), kThreads, 0, compute_stream()>>>(penalized, penalty_tokens, penalty_counts, n_penalty, vocab, a);
    CUDA_CHECK_LAUNCH();
  }
  int* token = ws.token.data();
  if (a.temperature == 0.f) {
    launch_argmax(x, vocab, ws, token);
  } else {
    size_t bytes = ws.cub_temp.bytes();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(ws.cub_temp.data(), bytes, x, ws.sorted.data(),
                                                         ws.ids.data(), ws.order.data(), vocab, 0, sizeof(float) * 8,
                                                         compute_stream()));
    const int k = a.top_k > 0 ? std::min(a.top_k, vocab) : vocab;  // top-k cuts before the softmax
    softmax_terms_kernel<<<blocks_for(k), kThreads, 0, compute_stream()>>>(ws.sorted.data(), k, a.temperature, ws.probs.data());
    CUDA_CHECK_LAUNCH();
    finish_kernel<<<1, kBlock, 0, compute_stream()>>>(ws.probs.data(), ws.order.data(), k, a, r, token);
    CUDA_CHECK_LAUNCH();
  }
  int result = 0;
  CUDA_CHECK(cudaMemcpy(&result, token, sizeof(int), cudaMemcpyDeviceToHost));
  return result;
}

}  // namespace ms::cuda
