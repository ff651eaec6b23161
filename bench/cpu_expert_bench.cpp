// One routed expert of one token on the CPU (cpu::int_expert, the hybrid decode's CPU side) in
// microseconds and GB/s of its weights, beside the machine's streaming-read rate measured in the
// same run. Shape: the 80B-A3B expert (gate and up [512, 2048], down [2048, 512]), 4-bit g64 by
// default. "cold": one of many experts cycled through, well beyond the caches (what decode sees);
// "hot": one expert repeated; "4 at once": cold experts four to a call of cpu::int_experts (a
// layer's CPU experts), per expert. Threads: MOESTREAM_THREADS or the cores.
//   bench_cpu_expert [bits] [group]
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/cpu_memory.h"
#include "kernels/cpu/int_expert.h"
#include "kernels/cpu/int_matmul.h"
#include "quant/affine.h"
#include "util/thread_pool.h"

namespace {

constexpr int kHidden = 2048, kInter = 512;
constexpr size_t kColdBytes = size_t(1) << 30;

struct Expert {
  ms::QuantBuffer gate, up, down;
  size_t bytes() const {
    size_t b = 0;
    for (const ms::QuantBuffer* m : {&gate, &up, &down}) b += m->q.size() + 2 * (m->scales.size() + m->biases.size());
    return b;
  }
};

Expert make_expert(int bits, int group, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 0.05f);
  auto quantized = [&](int rows, int cols) {
    std::vector<float> w(size_t(rows) * size_t(cols));
    for (auto& v : w) v = normal(rng);
    return ms::quantize(w.data(), rows, cols, bits, group);
  };
  return {quantized(kInter, kHidden), quantized(kInter, kHidden), quantized(kHidden, kInter)};
}

}  // namespace

int main(int argc, char** argv) {
  const int bits = argc > 1 ? std::atoi(argv[1]) : 4, group = argc > 2 ? std::atoi(argv[2]) : 64;
  std::mt19937 rng(5);
  std::vector<Expert> experts;
  experts.push_back(make_expert(bits, group, rng));
  const size_t bytes = experts[0].bytes();
  while (experts.size() * bytes < kColdBytes) experts.push_back(experts.back());  // copies: distinct memory
  std::vector<float> x(kHidden), y(kHidden);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& v : x) v = normal(rng);
  size_t next = 0;
  auto run = [&](bool cold) {
    const Expert& e = experts[cold ? next++ % experts.size() : 0];
    ms::cpu::int_expert(x.data(), e.gate.view(), e.up.view(), e.down.view(), 0.5f, y.data());
  };
  constexpr int kPerRun = 64;
  const double cold = ms::bench::median_seconds([&] {
                        for (int i = 0; i < kPerRun; ++i) run(true);
                      }) / kPerRun;
  const double hot = ms::bench::median_seconds([&] {
                       for (int i = 0; i < kPerRun; ++i) run(false);
                     }) / kPerRun;
  constexpr int kBatch = 4;
  std::vector<float> ys(size_t(kBatch) * kHidden);
  const double batched = ms::bench::median_seconds([&] {
                           for (int i = 0; i < kPerRun / kBatch; ++i) {
                             std::vector<ms::cpu::IntExpertJob> jobs;
                             for (int j = 0; j < kBatch; ++j) {
                               const Expert& e = experts[next++ % experts.size()];
                               jobs.push_back({e.gate.view(), e.up.view(), e.down.view(), 0.5f, ys.data() + size_t(j) * kHidden});
                             }
                             ms::cpu::int_experts(x.data(), jobs);
                           }
                         }) / kPerRun;
  std::vector<uint64_t> buf(kColdBytes / 8, 1);
  std::printf("cpu expert %d-bit g%d, %.2f MB, %d threads, %s: cold %.1f us (%.2f GB/s), hot %.1f us, %d at once %.1f us; memory read %.1f GB/s\n",
              bits, group, double(bytes) / 1e6, ms::ThreadPool::global().size(), ms::cpu::int_matmul_target(), cold * 1e6,
              double(bytes) / cold / 1e9, hot * 1e6, kBatch, batched * 1e6, ms::bench::stream_read_gbs(buf));
}
