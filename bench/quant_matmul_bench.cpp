// Decode-matvec throughput of matmul_quant, in GB/s of weight bytes consumed (packed q +
// scales + biases), against the machine's streaming-read bandwidth measured in the same run.
//
// "cold": the matrix is one of many copies that together far exceed the caches, cycled through,
// as experts streamed into RAM are; this is what decode sees. "hot": one matrix repeated, so it
// stays in cache; the gap between the two shows whether the kernel or memory is the limit.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench/cpu_memory.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/int_matmul.h"
#include "kernels/cpu/quant_matmul.h"
#include "util/half.h"
#include "quant/affine.h"
#include "util/thread_pool.h"

namespace {

using ms::bench::kRuns;
using ms::bench::median_seconds;
using ms::bench::stream_read_gbs;

constexpr size_t kColdBytes = size_t(1) << 30;  // well beyond the caches (260 MiB of L3 here)

double memcpy_gbs(std::vector<uint64_t>& dst, const std::vector<uint64_t>& src) {
  double s = median_seconds([&] { std::memcpy(dst.data(), src.data(), src.size() * 8); });
  return double(src.size() * 8) / s / 1e9;  // bytes copied (each read once and written once)
}

struct Copies {
  std::vector<uint8_t> q;
  std::vector<uint16_t> scales, biases;
  std::vector<ms::QuantMat> mats;
};

// A layout the engine stores: bf16 scales from convert, f16/f32 ones from GGUF imports.
struct Layout {
  int bits, group;
  ms::ScaleType scale_type;
  const char* as;  // the GGUF type it carries, or "" for convert's own
};

constexpr Layout kLayouts[] = {{2, 64, ms::ScaleType::BF16, ""},   {3, 64, ms::ScaleType::BF16, ""},
                                {4, 64, ms::ScaleType::BF16, ""},   {8, 64, ms::ScaleType::BF16, ""},
                                {4, 32, ms::ScaleType::F16, "Q4_0"}, {8, 32, ms::ScaleType::F16, "Q8_0"},
                                {4, 32, ms::ScaleType::F32, "Q4_K"}, {5, 32, ms::ScaleType::F32, "Q5_K"},
                                {6, 16, ms::ScaleType::F32, "Q6_K"}};

// qb's scales and biases as `t` (f32: two words an entry).
std::vector<uint16_t> typed(const std::vector<uint16_t>& bf16, ms::ScaleType t) {
  if (t == ms::ScaleType::BF16) return bf16;
  std::vector<uint16_t> out(bf16.size() * ms::scale_size(t) / 2);
  for (size_t i = 0; i < bf16.size(); ++i) {
    const float v = ms::bf16_to_f32(bf16[i]);
    if (t == ms::ScaleType::F16) out[i] = ms::f32_to_f16(v);
    else std::memcpy(&out[2 * i], &v, 4);
  }
  return out;
}

// n copies of one quantized matrix at distinct addresses, its scales as `t`.
Copies replicate(const ms::QuantBuffer& qb, size_t n, ms::ScaleType t) {
  const std::vector<uint16_t> scales = typed(qb.scales, t), biases = typed(qb.biases, t);
  Copies c;
  c.q.resize(qb.q.size() * n);
  c.scales.resize(scales.size() * n);
  c.biases.resize(biases.size() * n);
  for (size_t i = 0; i < n; ++i) {
    std::copy(qb.q.begin(), qb.q.end(), c.q.begin() + long(i * qb.q.size()));
    std::copy(scales.begin(), scales.end(), c.scales.begin() + long(i * scales.size()));
    std::copy(biases.begin(), biases.end(), c.biases.begin() + long(i * biases.size()));
    c.mats.push_back({c.q.data() + i * qb.q.size(), c.scales.data() + i * scales.size(),
                      c.biases.data() + i * biases.size(), qb.rows, qb.cols, qb.bits, qb.group, t});
  }
  return c;
}

size_t weight_bytes(const ms::QuantBuffer& qb, ms::ScaleType t) {
  return qb.q.size() + 2 * qb.scales.size() * ms::scale_size(t);
}

// The same measurement for unquantized bf16 weights through cpu::matmul.
void bench_bf16(int rows, int cols, const char* what, const std::vector<float>& w, const std::vector<float>& x,
                std::vector<float>& y, double read_bw) {
  const size_t bytes = size_t(rows) * size_t(cols) * 2;
  const size_t n = std::max<size_t>(2, kColdBytes / bytes);
  std::vector<uint16_t> copies(size_t(rows) * size_t(cols) * n);
  for (size_t i = 0; i < size_t(rows) * size_t(cols); ++i) copies[i] = ms::f32_to_bf16(w[i]);
  for (size_t c = 1; c < n; ++c)
    std::copy_n(copies.begin(), size_t(rows) * size_t(cols), copies.begin() + long(c * size_t(rows) * size_t(cols)));
  auto mat = [&](size_t c) { return ms::Mat{ms::WeightType::BF16, copies.data() + c * size_t(rows) * size_t(cols), rows, cols}; };
  const double hot = median_seconds([&] {
    for (size_t i = 0; i < n; ++i) ms::cpu::matmul(x.data(), 1, mat(0), y.data());
  });
  const double cold = median_seconds([&] {
    for (size_t i = 0; i < n; ++i) ms::cpu::matmul(x.data(), 1, mat(i), y.data());
  });
  char dims[32];
  std::snprintf(dims, sizeof dims, "%dx%d", rows, cols);
  const double cold_gbs = double(bytes * n) / cold / 1e9;
  std::printf("%-16s %-11s %4s %5s %6s %9.2f %9.1f %9.1f %9.2f\n", what, dims, "bf16", "-", "-", double(bytes) / 1e6,
              double(bytes * n) / hot / 1e9, cold_gbs, cold_gbs / read_bw);
}

}  // namespace

// Prefill: T tokens at once (an expert's few tokens, a dense chunk), in GFLOP/s (2 per weight
// and token) against the cores' FMA peak measured beside it.
void bench_prefill() {
  std::printf("\nprefill (T tokens at once): matmul_quant (float) and int_matmul (kernels/int_dot.h, %s)\n"
              "%-16s %-11s %4s %5s %9s %9s\n",
              ms::cpu::int_matmul_target(), "matrix", "rows x cols", "bits", "T", "GFLOP/s", "int");
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  struct Case {
    int rows, cols, bits, T;
    const char* what;
    int group = 64;
    ms::ScaleType st = ms::ScaleType::BF16;
    const char* gguf = "";
  };
  constexpr ms::ScaleType F16 = ms::ScaleType::F16;
  // moestream's layout (bf16 scales, groups of 64), then GGUF's Q4_0 / Q8_0 (f16, blocks of 32).
  const Case cases[] = {{512, 2048, 4, 1, "expert gate/up"},
                        {512, 2048, 4, 2, "expert gate/up"},
                        {512, 2048, 4, 3, "expert gate/up"},
                        {512, 2048, 4, 4, "expert gate/up"},
                        {512, 2048, 4, 8, "expert gate/up"},
                        {8192, 2048, 8, 16, "dense"},
                        {8192, 2048, 8, 128, "dense"},
                        {8192, 2048, 4, 128, "dense"},
                        {512, 2048, 4, 1, "expert gate/up", 32, F16, "Q4_0"},
                        {512, 2048, 4, 8, "expert gate/up", 32, F16, "Q4_0"},
                        {2048, 512, 4, 8, "expert down", 32, F16, "Q4_0"},
                        {8192, 2048, 8, 128, "dense", 32, F16, "Q8_0"}};
  for (const Case& c : cases) {
    std::vector<float> w(size_t(c.rows) * c.cols), x(size_t(c.T) * c.cols), y(size_t(c.T) * c.rows);
    for (auto& v : w) v = normal(rng);
    for (auto& v : x) v = normal(rng);
    const ms::QuantBuffer qb = ms::quantize(w.data(), c.rows, c.cols, c.bits, c.group);
    const Copies one = replicate(qb, 1, c.st);
    const ms::QuantMat m = one.mats[0];
    const int reps = std::max(1, 64 / c.T);
    const double s = median_seconds([&] {
      for (int r = 0; r < reps; ++r) ms::cpu::matmul_quant(x.data(), c.T, m, y.data());
    });
    const double si = median_seconds([&] {
      for (int r = 0; r < reps; ++r) ms::cpu::int_matmul(x.data(), c.T, m, y.data());
    });
    char dims[32];
    std::snprintf(dims, sizeof dims, "%dx%d", c.rows, c.cols);
    const double flop = 2.0 * double(c.rows) * c.cols * c.T * reps;
    std::printf("%-16s %-11s %4d %5d %9.1f %9.1f %s\n", c.what, dims, c.bits, c.T, flop / s / 1e9, flop / si / 1e9, c.gguf);
  }
}

int main() {
  const int threads = ms::ThreadPool::global().size();
  std::vector<uint64_t> buf(kColdBytes / 8, 1), dst(kColdBytes / 8, 0);
  const double read_bw = stream_read_gbs(buf);
  const double copy_bw = memcpy_gbs(dst, buf);
  std::printf("matmul_quant target %s, %d threads, medians of %d runs\n", ms::cpu::matmul_quant_target(), threads,
              kRuns);
  std::printf("memory: streaming read %.1f GB/s (%d threads), memcpy %.1f GB/s (1 thread)\n\n", read_bw, threads,
              copy_bw);
  buf = {};
  dst = {};

  struct Shape {
    int rows, cols;
    const char* what;
  };
  const Shape shapes[] = {{512, 2048, "expert gate/up"}, {2048, 512, "expert down"}, {8192, 2048, "dense"}};
  std::printf("%-16s %-11s %4s %5s %6s %9s %9s %9s %9s %s\n", "matrix", "rows x cols", "bits", "group", "scales", "MB",
              "hot GB/s", "cold GB/s", "cold/read", "carries");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const Shape& sh : shapes) {
    std::vector<float> w(size_t(sh.rows) * sh.cols), x(size_t(sh.cols)), y(size_t(sh.rows));
    for (auto& v : w) v = normal(rng);
    for (auto& v : x) v = normal(rng);
    for (const Layout& l : kLayouts) {
      ms::QuantBuffer qb = ms::quantize(w.data(), sh.rows, sh.cols, l.bits, l.group);
      const size_t bytes = weight_bytes(qb, l.scale_type);
      const size_t n = std::max<size_t>(2, kColdBytes / bytes);
      Copies copies = replicate(qb, n, l.scale_type);
      const ms::QuantMat hot_mat = copies.mats[0];
      double hot = median_seconds([&] {
        for (size_t i = 0; i < n; ++i) ms::cpu::matmul_quant(x.data(), 1, hot_mat, y.data());
      });
      double cold = median_seconds([&] {
        for (const ms::QuantMat& m : copies.mats) ms::cpu::matmul_quant(x.data(), 1, m, y.data());
      });
      const double hot_gbs = double(bytes * n) / hot / 1e9, cold_gbs = double(bytes * n) / cold / 1e9;
      char dims[32];
      std::snprintf(dims, sizeof dims, "%dx%d", sh.rows, sh.cols);
      std::printf("%-16s %-11s %4d %5d %6s %9.2f %9.1f %9.1f %9.2f %s\n", sh.what, dims, l.bits, l.group,
                  ms::scale_type_name(l.scale_type), double(bytes) / 1e6, hot_gbs, cold_gbs, cold_gbs / read_bw, l.as);
    }
    bench_bf16(sh.rows, sh.cols, sh.what, w, x, y, read_bw);
  }
  bench_prefill();
  return 0;
}
