// Decode attention on the CPU (cpu::attention, one token over its KV cache) at Qwen3-Next-80B's
// heads (16 query heads over 2 KV heads of 256) and Qwen3-30B-A3B's (32 over 4 of 128), against
// the machine's streaming-read bandwidth measured in the same run. The cache is one of enough
// copies to exceed the caches, cycled through, as a decode step's layers do; GB/s counts the
// cache's bytes once (keys and values of every position), what a token must read.
//
//   build/bench/bench_cpu_attention
#include <cstdio>
#include <random>
#include <vector>

#include "bench/cpu_memory.h"
#include "kernels/cpu/ops.h"
#include "util/thread_pool.h"

namespace {

constexpr size_t kColdBytes = size_t(512) << 20;

struct Shape {
  const char* name;
  int n_heads, n_kv, hd;
};

void run(const Shape& sh, int len, double read_gbs) {
  const size_t per_pos = size_t(sh.n_kv) * size_t(sh.hd), cache = size_t(len) * per_pos;
  const size_t copies = std::max<size_t>(2, kColdBytes / (2 * cache * sizeof(float)));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> q(size_t(sh.n_heads) * size_t(sh.hd)), k(cache * copies), v(cache * copies),
      out(q.size());
  for (auto& x : q) x = nd(rng);
  for (size_t i = 0; i < cache; ++i) k[i] = nd(rng), v[i] = nd(rng);
  for (size_t c = 1; c < copies; ++c) {
    std::copy_n(k.begin(), cache, k.begin() + long(c * cache));
    std::copy_n(v.begin(), cache, v.begin() + long(c * cache));
  }
  const double s = ms::bench::median_seconds([&] {
    for (size_t c = 0; c < copies; ++c)
      ms::cpu::attention(q.data(), k.data() + c * cache, v.data() + c * cache, 1, len - 1, sh.n_heads, sh.n_kv,
                         sh.hd, out.data());
  }) / double(copies);
  const double gbs = 2.0 * double(cache) * sizeof(float) / s / 1e9;
  std::printf("%-14s %6d positions %9.3f ms %8.1f GB/s %6.1f%% of read\n", sh.name, len, s * 1e3, gbs,
              100.0 * gbs / read_gbs);
}

}  // namespace

int main() {
  const int threads = ms::ThreadPool::global().size();
  double read_gbs = 0;
  {
    const std::vector<uint64_t> buf(kColdBytes / 8, 1);
    read_gbs = ms::bench::stream_read_gbs(buf);
  }
  std::printf("cpu::attention, one decode token, %d threads, medians of %d runs; streaming read %.1f GB/s\n", threads,
              ms::bench::kRuns, read_gbs);
  for (const Shape& sh : {Shape{"80B 16/2x256", 16, 2, 256}, Shape{"30B 32/4x128", 32, 4, 128}})
    for (int len : {256, 4096, 32768}) run(sh, len, read_gbs);
}
