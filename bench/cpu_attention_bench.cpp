// Decode attention on the CPU (cpu::attention, one token over its KV cache) at Qwen3-Next-80B's
// heads (16 query heads over 2 KV heads of 256) and Qwen3-30B-A3B's (32 over 4 of 128), for each
// KV cache format (float32, bf16, K8/V8, K4/V3: quant/kv_quant.h), against the machine's
// streaming-read bandwidth measured in the same run. The cache is one of enough copies to exceed
// the caches, cycled through, as a decode step's layers do; GB/s counts the cache's bytes once
// (keys and values of every position in the format), what a token must read.
//
//   build/bench/bench_cpu_attention
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/cpu_memory.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cpu/ops.h"
#include "util/thread_pool.h"

namespace {

constexpr size_t kColdBytes = size_t(512) << 20;

struct Shape {
  const char* name;
  int n_heads, n_kv, hd;
};

void run(const Shape& sh, int len, ms::KvSide ks, ms::KvSide vs, double read_gbs) {
  const size_t rows = size_t(len) * size_t(sh.n_kv);
  const size_t k_bytes = rows * ks.row_bytes(sh.hd), v_bytes = rows * vs.row_bytes(sh.hd);
  const size_t copies = std::max<size_t>(2, kColdBytes / (k_bytes + v_bytes));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> q(size_t(sh.n_heads) * size_t(sh.hd)), kf(rows * size_t(sh.hd)), vf(kf.size()), out(q.size());
  for (auto& x : q) x = nd(rng);
  for (size_t i = 0; i < kf.size(); ++i) kf[i] = nd(rng), vf[i] = nd(rng);
  std::vector<uint8_t> k(k_bytes * copies), v(v_bytes * copies);
  ms::cpu::kv_store(kf.data(), rows, sh.hd, ks, nullptr, k.data());
  ms::cpu::kv_store(vf.data(), rows, sh.hd, vs, nullptr, v.data());
  for (size_t c = 1; c < copies; ++c) {
    std::copy_n(k.begin(), k_bytes, k.begin() + long(c * k_bytes));
    std::copy_n(v.begin(), v_bytes, v.begin() + long(c * v_bytes));
  }
  const double s = ms::bench::median_seconds([&] {
    for (size_t c = 0; c < copies; ++c)
      ms::cpu::attention(q.data(), ms::cpu::KvRows{k.data() + c * k_bytes, ks}, ms::cpu::KvRows{v.data() + c * v_bytes, vs},
                         1, len - 1, sh.n_heads, sh.n_kv, sh.hd, out.data());
  }) / double(copies);
  const double gbs = double(k_bytes + v_bytes) / s / 1e9;
  ms::KvFormat f;
  f.k = ks, f.v = vs;
  std::printf("%-14s %-8s %6d positions %8.2f MB %9.3f ms %8.1f GB/s %6.1f%% of read\n", sh.name,
              f.describe().substr(0, f.describe().find(' ')).c_str(), len, double(k_bytes + v_bytes) / 1e6, s * 1e3,
              gbs, 100.0 * gbs / read_gbs);
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
  const std::pair<int, int> formats[] = {{32, 32}, {16, 16}, {8, 8}, {4, 3}};
  for (const Shape& sh : {Shape{"80B 16/2x256", 16, 2, 256}, Shape{"30B 32/4x128", 32, 4, 128}})
    for (int len : {1024, 8192, 32768})
      for (const auto& [kb, vb] : formats) run(sh, len, ms::KvSide{kb, 64}, ms::KvSide{vb, 64}, read_gbs);
}
