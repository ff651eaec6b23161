// Decode matvec (T = 1) on the GPU: achieved bandwidth of cuda::matmul for bf16 and affine
// 2/3/4/8-bit weights, expert-sized, Qwen3-Next-80B's linear-attention projections and
// dense-sized, against the HBM bandwidth measured in the same run by a device-to-device copy.
// Each shape is replicated over enough copies that their sum is well past the L2 cache, and the
// calls cycle over the copies, as a decode step's experts and layers do. Bytes counted: weights,
// scales and biases, x read and y written. Each is timed launched one by one and, as a decode step
// runs them, as 100 calls in a CUDA graph (where a launch costs the host nothing, so that the GPU
// time shows for the smaller ones). With --floor, beside each the same bytes read by the simplest
// streaming kernel launched as the matvecs are (bench::stream_read), both ways, and the matvec's
// time as a share of its time: below a few tens of MB a launch's ramp and the memory's latency,
// not its bandwidth, bound both. With --hot, each also in a graph of 100 calls on one copy, whose
// weights stay in the L2 where they fit (a matrix a kernel before it prefetched would be read so).
// With --after-norm, each also in a graph after the RMSNorm that writes its x (its time less the
// norm's): a decode step's matvecs follow such small kernels, which let them launch early, rather
// than one another.
// Then the routed experts of a decode step at Qwen3-Next-80B's shape: cuda::moe_experts against
// the per-expert launches it replaces, and cuda::route_topk.
// Prefill (filter "gemm"): the custom kernel against the cuBLAS form of cuda::matmul and the
// integer GEMM (int_gemm.h), and their crossover over T; (filter "prefill experts") a prompt
// chunk's routed experts, per-expert launches against cuda::int_experts.
// Also the Gated DeltaNet rule at Qwen3-Next-80B's shape, recurrent against chunked, over T: where
// gated_delta_rule switches from one to the other (kDeltaChunkedMinTokens) and what prefill costs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "format/engine_dir.h"

#include "kernels/cuda/check.h"
#include "kernels/cuda/deltanet.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/int_gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/stream.h"
#include "stream_read.h"

using namespace ms;

namespace {

constexpr size_t kWorkingSet = size_t(1) << 30;  // bytes of weights cycled over: 20x the L2
constexpr cuda::DeviceAlloc kNow = cuda::DeviceAlloc::Now;  // the bench's buffers: cudaMalloc'ed

// Milliseconds per call of fn(i), over calls covering at least min_ms, after one warm-up round.
template <class F>
double time_ms(int rounds, F&& fn) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  fn(0);
  CUDA_CHECK(cudaEventRecord(a, cuda::compute_stream()));
  for (int i = 0; i < rounds; ++i) fn(i);
  CUDA_CHECK(cudaEventRecord(b, cuda::compute_stream()));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return double(ms) / rounds;
}

// Milliseconds of GPU time per call of fn(i) for kernels shorter than their launch: 100 calls
// captured into a CUDA graph (cuda::Graph), replayed `rounds` times, as a decode step runs them.
template <class F>
double graph_ms(int rounds, F&& fn) {
  constexpr int kCalls = 100;
  cuda::Graph graph;
  graph.begin_capture();
  for (int i = 0; i < kCalls; ++i) fn(i);
  graph.end_capture();
  return time_ms(rounds, [&](int) { graph.launch(); }) / kCalls;
}

struct Config {
  const char* name;
  int rows, cols, bits;  // bits 16: bf16
  ScaleType scales = ScaleType::BF16;  // f16 and f32: an imported GGUF's layouts
};

std::string type_name(const Config& c, int group) {
  if (c.bits == 16) return "bf16";
  std::string name = "q";  // appended piecewise: "q" + std::to_string(...) trips g++ 12's -Wrestrict
  name.append(std::to_string(c.bits)).append(" g").append(std::to_string(group));
  if (c.scales != ScaleType::BF16) name.append(" ").append(scale_type_name(c.scales));
  return name;
}

// Copies of one shape's weights (codes 0x5a, scales and biases of bytes 0x3c: 0.0115 as bf16 or
// f32, 1.06 as f16), as many as fill kWorkingSet, to cycle over.
struct Copies {
  cuda::DeviceArray<uint8_t> q, sb;  // sb: bf16 scales and biases, as bytes
  std::vector<Mat> mats;
  size_t per_copy = 0;  // bytes of one: weights, scales and biases
};

Copies make_copies(const Config& c, int group) {
  const size_t q_bytes = size_t(c.rows) * c.cols * c.bits / 8;
  const size_t sb_bytes = c.bits == 16 ? 0 : size_t(c.rows) * (c.cols / group) * scale_size(c.scales);
  Copies w;
  w.per_copy = q_bytes + 2 * sb_bytes;
  const int copies = int(std::max<size_t>(1, kWorkingSet / w.per_copy));
  w.q = cuda::DeviceArray<uint8_t>(q_bytes * copies, kNow);
  w.sb = cuda::DeviceArray<uint8_t>(2 * sb_bytes * copies + 2, kNow);
  CUDA_CHECK(cudaMemset(w.q.data(), 0x5a, w.q.bytes()));
  CUDA_CHECK(cudaMemset(w.sb.data(), 0x3c, w.sb.bytes()));
  for (int i = 0; i < copies; ++i) {
    const auto* s = reinterpret_cast<const uint16_t*>(w.sb.data() + 2 * sb_bytes * i);
    if (c.bits == 16)
      w.mats.push_back(Mat{WeightType::BF16, w.q.data() + q_bytes * i, c.rows, c.cols});
    else
      w.mats.push_back(Mat{WeightType::Affine, w.q.data() + q_bytes * i, c.rows, c.cols, c.bits, group, s,
                           s + sb_bytes / 2, c.scales});
  }
  return w;
}

// Milliseconds per call of the floor under a matvec of `bytes` bytes of weights: bench::stream_read
// of as many bytes, over `copies` copies cycled as run() cycles the weights, launched one by one
// or in a graph.
double stream_read_ms(size_t bytes, int copies, int rounds, bool graphed) {
  const size_t span = (bytes + 15) / 16 * 16;
  cuda::DeviceArray<uint8_t> flat(span * size_t(copies), kNow);
  cuda::DeviceArray<uint32_t> sink(1, kNow);
  CUDA_CHECK(cudaMemset(flat.data(), 0x5a, flat.bytes()));
  auto read = [&](int i) {
    bench::stream_read(flat.data() + span * size_t(i % copies), bytes / 16 * 16, sink.data());
  };
  return graphed ? graph_ms(std::max(1, rounds / 100), read) : time_ms(rounds, read);
}

// The columns beside a matvec's own two (command-line flags).
struct Columns {
  bool floor = false, after_norm = false, hot = false;
};

void run(const Config& c, int group, int T, double hbm, const std::string& filter, const Columns& more) {
  const std::string type = type_name(c, group);
  std::string what = "matvec ";
  what.append(c.name).append(" ").append(type);
  if (what.find(filter) == std::string::npos) return;
  const Copies w = make_copies(c, group);
  const int copies = int(w.mats.size());
  cuda::DeviceArray<float> x(size_t(T) * c.cols, kNow), y(size_t(T) * c.rows, kNow);
  CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.bytes()));
  const int rounds = std::max(copies, std::min(2000, int(20e9 / double(w.per_copy))));
  auto matvec = [&](int i) { cuda::matmul(x.data(), T, w.mats[size_t(i % copies)], y.data()); };
  const double ms = time_ms(rounds, matvec), graphed = graph_ms(std::max(1, rounds / 100), matvec);
  const double bytes = double(w.per_copy) + 4.0 * T * (c.cols + c.rows);
  auto of_copy = [&](double t) { return 100.0 * bytes / (t * 1e6) / hbm; };
  std::printf("%-22s %6d x %-6d %-8s T=%-2d %9.2f us %8.0f GB/s %5.1f%% of copy | graph %7.2f us %5.1f%%", c.name,
              c.rows, c.cols, type.c_str(), T, ms * 1e3, bytes / (ms * 1e6), of_copy(ms), graphed * 1e3,
              of_copy(graphed));
  if (more.floor) {
    const double floor_ms = stream_read_ms(w.per_copy, copies, rounds, false);
    const double floor_graphed = stream_read_ms(w.per_copy, copies, rounds, true);
    std::printf(" | stream read %7.2f us, matvec %5.1f%% of it"
                " | graphed %7.2f us %5.1f%% of copy, matvec %5.1f%% of it",
                floor_ms * 1e3, 100.0 * floor_ms / ms, floor_graphed * 1e3,
                100.0 * double(w.per_copy) / (floor_graphed * 1e6) / hbm, 100.0 * floor_graphed / graphed);
  }
  if (more.after_norm) {
    // Each call after the RMSNorm that writes its x, as a decode step runs a matvec: the pair's
    // time less the norm's alone.
    cuda::DeviceArray<float> src(x.size(), kNow), gamma(size_t(c.cols), kNow);
    CUDA_CHECK(cudaMemset(src.data(), 0x3c, src.bytes()));
    CUDA_CHECK(cudaMemset(gamma.data(), 0, gamma.bytes()));
    auto norm = [&](int) { cuda::rmsnorm(src.data(), T, c.cols, gamma.data(), 1.0f, 1e-6f, x.data()); };
    const int graphs = std::max(1, rounds / 100);
    const double pair = graph_ms(graphs, [&](int i) { norm(i), matvec(i); }), alone = graph_ms(graphs, norm);
    std::printf(" | after a norm %7.2f us %5.1f%%", (pair - alone) * 1e3, of_copy(pair - alone));
  }
  if (more.hot) {
    const double hot_ms =
        graph_ms(std::max(1, rounds / 100), [&](int) { cuda::matmul(x.data(), T, w.mats[0], y.data()); });
    std::printf(" | hot graph %7.2f us, %6.0f GB/s", hot_ms * 1e3, bytes / (hot_ms * 1e6));
  }
  std::printf("\n");
}

// Microseconds per call of fn(i) over about 50 ms of calls (at least 3).
template <class F>
double time_us(F&& fn) {
  const double once = time_ms(1, fn);
  return 1e3 * time_ms(int(std::clamp(50.0 / once, 3.0, 1000.0)), fn);
}

// The integer GEMM's warp tiles the prefill benchmarks compare.
const cuda::IntGemmTiles kTileChoices[] = {{1, 4, false}, {1, 4, true}, {1, 2, true}, {2, 2, false},
                                           {2, 2, true},  {4, 2, true}};

std::string tile_name(const cuda::IntGemmTiles& t) {
  return std::to_string(16 * t.mt) + "x" + std::to_string(8 * t.nt) + (t.unroll ? "u" : "");
}

// Prefill: the custom kernel (matmul_direct) against the cuBLAS form (matmul_gemm, with the
// default 64 MiB scratch and with 16 MiB, whose tiles stay in the L2 between the dequantization
// and the SGEMM) at T tokens, in microseconds and TFLOP/s (2·T·rows·cols).
void run_prefill(const Config& c, int T, const std::string& filter) {
  const std::string what = std::string("gemm ") + c.name + " " + type_name(c, 64);
  if (what.find(filter) == std::string::npos) return;
  const Copies w = make_copies(c, 64);
  const size_t copies = w.mats.size();
  cuda::DeviceArray<float> x(size_t(T) * c.cols, kNow), y(size_t(T) * c.rows, kNow);
  CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.bytes()));
  const double direct = time_us([&](int i) { cuda::matmul_direct(x.data(), T, w.mats[size_t(i) % copies], y.data()); });
  const double gemm = time_us([&](int i) { cuda::matmul_gemm(x.data(), T, w.mats[size_t(i) % copies], y.data()); });
  const double gemm16 = time_us([&](int i) {
    cuda::matmul_gemm(x.data(), T, w.mats[size_t(i) % copies], y.data(), size_t(16) << 20);
  });
  const double flop = 2.0 * T * double(c.rows) * c.cols;
  std::printf("%-34s %6d x %-6d T=%-4d direct %9.1f us %6.2f TFLOP/s | gemm %9.1f us %6.2f TFLOP/s | gemm 16 MiB %9.1f us"
              " %6.2f TFLOP/s",
              what.c_str(), c.rows, c.cols, T, direct, flop / (direct * 1e6), gemm, flop / (gemm * 1e6), gemm16,
              flop / (gemm16 * 1e6));
  if (cuda::int_gemm_layout(w.mats[0])) {
    const double in = time_us([&](int i) { cuda::int_matmul(x.data(), T, w.mats[size_t(i) % copies], y.data()); });
    std::printf(" | int %9.1f us %6.2f TFLOP/s |", in, flop / (in * 1e6));
    for (const cuda::IntGemmTiles& t : kTileChoices) {
      const double us = time_us([&](int i) { cuda::int_matmul(x.data(), T, w.mats[size_t(i) % copies], y.data(), t); });
      std::printf(" %s %.1f", tile_name(t).c_str(), us);
    }
  }
  std::printf("\n");
}

// A prompt chunk's routed experts at Qwen3-Next-80B's shape (hidden 2048, moe_intermediate 512,
// 512 experts of `bits`-bit records, top 10), T tokens routed at random: cuda::int_experts (all
// experts in 3 launches and 2 splits) against what prefill ran before it, each used expert's
// gather, 3 matmuls (matmul_direct: a few tokens each), silu_mul and scatter; then sum_slots.
void run_prefill_experts(const std::string& filter, int bits, int group, ScaleType scales, int T) {
  const std::string name = "prefill experts 80B " + type_name(Config{"", 0, 0, bits, scales}, group);
  if (name.find(filter) == std::string::npos) return;
  constexpr int H = 2048, I = 512, E = 512, K = 10;
  const ExpertLayer layer = plan_expert_layer(
      "model.layers.0.mlp", "experts/layer_000.bin", E,
      {ProjSpec{bits, group, I, H, scales}, ProjSpec{bits, group, I, H, scales}, ProjSpec{bits, group, H, I, scales}});
  cuda::DeviceArray<uint8_t> blob(size_t(E) * layer.stride, kNow);
  CUDA_CHECK(cudaMemset(blob.data(), 0x3c, blob.bytes()));
  cuda::DeviceArray<float> x(size_t(T) * H, kNow), partial(size_t(T) * K * H, kNow), out(size_t(T) * H, kNow);
  CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.bytes()));
  std::mt19937 rng(7);
  std::vector<int> all(E);
  for (int e = 0; e < E; ++e) all[size_t(e)] = e;
  std::vector<std::vector<int>> users(E);
  for (int t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < K; ++k) users[size_t(all[size_t(k)])].push_back(t * K + k);
  }
  std::vector<int> token_rows, user_ids;
  std::vector<size_t> begin, end;
  std::vector<cuda::IntExpertMat> gate, up, down;
  auto mat = [&](int e, const ProjLayout& p) {
    const uint8_t* rec = blob.data() + size_t(e) * layer.stride;
    return Mat{WeightType::Affine, rec + p.q_offset, p.rows, p.cols, p.bits, p.group,
               reinterpret_cast<const uint16_t*>(rec + p.scales_offset),
               reinterpret_cast<const uint16_t*>(rec + p.biases_offset), p.scale_type};
  };
  auto of = [](const Mat& m) { return cuda::IntExpertMat{static_cast<const uint8_t*>(m.data), m.scales, m.biases}; };
  std::vector<int> used;
  for (int e = 0; e < E; ++e) {
    if (users[size_t(e)].empty()) continue;
    used.push_back(e);
    begin.push_back(user_ids.size());
    for (int u : users[size_t(e)]) token_rows.push_back(u / K), user_ids.push_back(u);
    end.push_back(user_ids.size());
    gate.push_back(of(mat(e, layer.proj[0]))), up.push_back(of(mat(e, layer.proj[1]))), down.push_back(of(mat(e, layer.proj[2])));
  }
  const auto d_rows = cuda::DeviceArray<int>::from(token_rows, kNow), d_users = cuda::DeviceArray<int>::from(user_ids, kNow);
  const auto d_w = cuda::DeviceArray<float>::from(std::vector<float>(user_ids.size(), 0.1f), kNow);
  const cuda::IntExperts ie{.n = int(used.size()), .gate = gate.data(), .up = up.data(), .down = down.data(),
                            .gate_layout = mat(0, layer.proj[0]), .down_layout = mat(0, layer.proj[2]),
                            .begin = begin.data(), .end = end.data(), .users_total = int(user_ids.size()),
                            .token_rows = d_rows.data(), .users = d_users.data(), .weights = d_w.data()};
  const double together = time_us([&](int) {
    cuda::int_experts(ie, x.data(), T, partial.data());
    cuda::sum_slots(partial.data(), T, K, H, out.data());
  });
  cuda::DeviceArray<float> xb(size_t(T) * H, kNow), g(size_t(T) * I, kNow), u(size_t(T) * I, kNow), y(size_t(T) * H, kNow);
  const double apart = time_us([&](int) {
    for (size_t i = 0; i < used.size(); ++i) {
      const int e = used[i], n = int(end[i] - begin[i]);
      cuda::gather_rows(x.data(), d_rows.data() + begin[i], n, H, xb.data());
      cuda::matmul_direct(xb.data(), n, mat(e, layer.proj[0]), g.data());
      cuda::matmul_direct(xb.data(), n, mat(e, layer.proj[1]), u.data());
      cuda::silu_mul(g.data(), u.data(), g.data(), int64_t(n) * I);
      cuda::matmul_direct(g.data(), n, mat(e, layer.proj[2]), y.data());
      cuda::scatter_scaled(y.data(), d_users.data() + begin[i], d_w.data() + begin[i], n, H, partial.data());
    }
    cuda::sum_slots(partial.data(), T, K, H, out.data());
  });
  const double flop = 2.0 * 3 * double(T) * K * H * I;
  std::printf("%-40s T=%-5d %zu experts: per-expert launches %9.1f us (%.1f TFLOP/s) | int_experts %9.1f us (%.1f TFLOP/s) "
              "| %.2fx\n",
              name.c_str(), T, used.size(), apart, flop / (apart * 1e6), together, flop / (together * 1e6),
              apart / together);
  std::printf("%-40s T=%-5d int_experts by warp tile (rows x tokens, u: a unit's loads together):", name.c_str(), T);
  for (const cuda::IntGemmTiles& t : kTileChoices) {
    const double us = time_us([&](int) { cuda::int_experts(ie, x.data(), T, partial.data(), t); });
    std::printf(" %s %.1f us", tile_name(t).c_str(), us);
  }
  std::printf("\n");
}

// One decode step's routed experts at Qwen3-Next-80B's shape (hidden 2048, moe_intermediate 512,
// 512 experts of `bits`-bit records in groups of `group` with `scales`, top 10): moe_experts (two
// launches), and what the
// forward runs without it, per expert matmul x3 + silu_mul + scatter_scaled and then sum_slots.
// Each call routes to 10 random distinct experts of the 512 (885 MB of 4-bit records, past the
// L2). Bytes counted: the 10 records' weights, scales and biases, x read and out written.
void run_moe(double hbm, const std::string& filter, int bits, int group = 64, ScaleType scales = ScaleType::BF16) {
  const std::string name = "moe_experts 80B " + type_name(Config{"", 0, 0, bits, scales}, group);
  if (name.find(filter) == std::string::npos) return;
  constexpr int H = 2048, I = 512, E = 512, K = 10, kRoutes = 256;
  const ExpertLayer layer = plan_expert_layer(
      "model.layers.0.mlp", "experts/layer_000.bin", E,
      {ProjSpec{bits, group, I, H, scales}, ProjSpec{bits, group, I, H, scales}, ProjSpec{bits, group, H, I, scales}});
  cuda::DeviceArray<uint8_t> blob(size_t(E) * layer.stride, kNow);
  cuda::DeviceArray<float> x(H, kNow), out(H, kNow), h(size_t(K) * I, kNow), g(I, kNow), u(I, kNow), y(H, kNow),
      partial(size_t(K) * H, kNow), dw(K, kNow);
  cuda::DeviceArray<int> dslots(K, kNow);
  CUDA_CHECK(cudaMemset(blob.data(), 0x3c, blob.bytes()));  // codes 0x3c, bf16 scales and biases ≈ 0.0115
  CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.bytes()));
  dw.upload(std::vector<float>(K, 1.0f / K).data(), K);
  std::vector<int> slots(K);
  for (int k = 0; k < K; ++k) slots[size_t(k)] = k;
  dslots.upload(slots.data(), K);

  std::mt19937 rng(5);
  std::vector<int> all(E);
  for (int e = 0; e < E; ++e) all[size_t(e)] = e;
  std::vector<int> ids;  // [kRoutes][K]
  std::vector<const uint8_t*> records;
  for (int r = 0; r < kRoutes; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < K; ++k) {
      ids.push_back(all[size_t(k)]);
      records.push_back(blob.data() + size_t(all[size_t(k)]) * layer.stride);
    }
  }
  const auto drecords = cuda::DeviceArray<const uint8_t*>::from(records, kNow);
  cuda::RecordMat proj[3];
  size_t expert_bytes = 0;
  for (size_t i = 0; i < 3; ++i) {
    const ProjLayout& p = layer.proj[i];
    proj[i] = {p.bits, p.group, p.rows, p.cols, p.q_offset, p.scales_offset, p.biases_offset, p.scale_type};
    expert_bytes += p.q_bytes + 2 * p.scales_bytes;
  }
  const double bytes = double(K) * double(expert_bytes) + 2.0 * H * 4;
  auto report = [&](const char* what, double ms) {
    const double gbps = bytes / (ms * 1e6);
    std::printf("%-40s T=1 K=%d %9.2f us %8.0f GB/s %5.1f%% of copy\n", what, K, ms * 1e3, gbps, 100.0 * gbps / hbm);
  };
  const int rounds = 2000;
  auto experts = [&](int i) {
    cuda::moe_experts(x.data(), 1, K, drecords.data() + size_t(i % kRoutes) * K, dw.data(),
                      proj, out.data(), h.data());
  };
  report((name + " (2 launches)").c_str(), time_ms(rounds, experts));
  report((name + " (in a graph)").c_str(), graph_ms(rounds / 100, experts));
  auto mat = [&](const uint8_t* rec, const ProjLayout& p) {
    return Mat{WeightType::Affine, rec + p.q_offset, p.rows, p.cols, p.bits, p.group,
               reinterpret_cast<const uint16_t*>(rec + p.scales_offset),
               reinterpret_cast<const uint16_t*>(rec + p.biases_offset), p.scale_type};
  };
  report("  per-expert launches (51)", time_ms(rounds / 4, [&](int i) {
           for (int k = 0; k < K; ++k) {
             const uint8_t* rec = records[size_t(i % kRoutes) * K + size_t(k)];
             cuda::matmul(x.data(), 1, mat(rec, layer.proj[0]), g.data());
             cuda::matmul(x.data(), 1, mat(rec, layer.proj[1]), u.data());
             cuda::silu_mul(g.data(), u.data(), g.data(), I);
             cuda::matmul(g.data(), 1, mat(rec, layer.proj[2]), y.data());
             cuda::scatter_scaled(y.data(), dslots.data() + k, dw.data() + k, 1, H, partial.data());
           }
           cuda::sum_slots(partial.data(), 1, K, H, out.data());
         }));
}

// cuda::route_topk at Qwen3-Next-80B's shape: 512 experts, top 10.
void run_route(const std::string& filter) {
  if (std::string("route_topk").find(filter) == std::string::npos) return;
  constexpr int E = 512, K = 10;

  cuda::DeviceArray<float> logits(E, kNow), probs(E, kNow), rw(K, kNow);
  cuda::DeviceArray<int> rid(K, kNow);
  CUDA_CHECK(cudaMemset(logits.data(), 0x3c, logits.bytes()));
  auto route = [&](int) {
    cuda::route_topk(logits.data(), 1, E, K, true, probs.data(), rid.data(), rw.data());
  };
  std::printf("%-40s T=1 E=%d K=%d %9.2f us launched, %.2f us in a graph\n", "route_topk", E, K,
              time_ms(2000, route) * 1e3, graph_ms(20, route) * 1e3);
}

// Microseconds per gated delta rule call of T tokens, 16 key and 32 value heads of 128 (80B),
// recurrent and chunked. Unit-norm q and k, moderate decays and betas: the kernels' time does not
// depend on the values, only on finite ones.
void run_delta_rule(const std::string& filter) {
  if (std::string("gated_delta_rule").find(filter) == std::string::npos) return;
  constexpr int hk = 16, hv = 32, d = 128, max_T = 4096;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> qk(size_t(max_T) * hk * d), v(size_t(max_T) * hv * d), g(size_t(max_T) * hv, -0.1f),
      beta(g.size(), 0.6f), state(size_t(hv) * d * d, 0.0f);
  for (float& x : qk) x = normal(rng) / std::sqrt(float(d));
  for (float& x : v) x = normal(rng);
  using Floats = cuda::DeviceArray<float>;
  Floats dq = Floats::from(qk, kNow), dk = Floats::from(qk, kNow), dv = Floats::from(v, kNow),
         dg = Floats::from(g, kNow), db = Floats::from(beta, kNow), dst = Floats::from(state, kNow),
         dout(v.size(), kNow);
  std::printf("gated_delta_rule, %d/%d heads, dk = dv = %d (chunked from T >= %d):\n", hk, hv, d,
              cuda::kDeltaChunkedMinTokens);
  for (int T : {1, 2, 4, 8, 12, 16, 24, 32, 64, 128, 256, 1024, 4096}) {
    const int rounds = std::max(3, 2000 / T);
    double us[2];
    int i = 0;
    for (auto fn : {cuda::gated_delta_rule_recurrent, cuda::gated_delta_rule_chunked})
      us[i++] = 1e3 * time_ms(rounds, [&](int) {
                  fn(dq.data(), dk.data(), dv.data(), dg.data(), db.data(), T, hk, hv, d, d,
                     dst.data(), dout.data());
                });
    std::printf("  T=%-5d recurrent %10.1f us  chunked %10.1f us  (%.2fx)\n", T, us[0], us[1], us[0] / us[1]);
  }
}

}  // namespace

// Optional argument: run only the cases whose "kind name type" contains it (e.g. "matvec" for the
// decode matvecs alone, "matvec lm_head 151936 q4", "gemm", "moe_experts", "route_topk",
// "gated_delta_rule"). --floor: each matvec also with the stream read of its bytes beside it;
// --after-norm: each also after the RMSNorm that writes its x, as a decode step runs it; --hot: each
// also with its weights L2-resident where they fit.
int main(int argc, char** argv) {
  std::string filter;
  Columns more;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--floor")
      more.floor = true;
    else if (std::string(argv[i]) == "--after-norm")
      more.after_norm = true;
    else if (std::string(argv[i]) == "--hot")
      more.hot = true;
    else
      filter = argv[i];
  }
  if (!cuda::cuda_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double hbm = bench::copy_gbps();
  std::printf("%s, %d SMs, L2 %d MB; device-to-device copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, hbm);
  const Config shapes[] = {{"expert gate/up", 512, 2048, 0},     {"expert down", 2048, 512, 0},
                           {"expert (Qwen3-30B) up", 768, 2048, 0}, {"80B in_proj_qkvz", 12288, 2048, 0},
                           {"80B out_proj", 2048, 4096, 0},         {"dense 4096", 4096, 4096, 0},
                           {"dense 8192", 8192, 8192, 0},           {"lm_head 151936", 151936, 2048, 0}};
  for (int bits : {16, 8, 4, 3, 2})
    for (Config c : shapes) {
      c.bits = bits;
      run(c, 64, 1, hbm, filter, more);
    }
  for (int group : {32, 128}) run(Config{"lm_head 151936", 151936, 2048, 4}, group, 1, hbm, filter, more);
  // The layouts of GGUF imports: Q4_0 and Q8_0 (f16 scales, on the tensor cores), Q4_K, Q5_K and
  // Q6_K (f32; Q6_K in groups of 16: the float kernel); 4-bit g32 with bf16 scales beside them.
  struct Imported {
    int bits, group;
    ScaleType scales;
  };
  for (const Imported& l : {Imported{4, 32, ScaleType::BF16}, Imported{4, 32, ScaleType::F16},
                            Imported{8, 32, ScaleType::F16}, Imported{4, 32, ScaleType::F32},
                            Imported{5, 32, ScaleType::F32}, Imported{6, 16, ScaleType::F32}})
    for (Config c : {shapes[0], shapes[1], shapes[3], shapes[7]}) {
      c.bits = l.bits, c.scales = l.scales;
      run(c, l.group, 1, hbm, filter, more);
    }
  std::printf("prefill/verify batches (weights reused by 4 tokens a block):\n");
  for (int T : {4, 16})
    for (int bits : {16, 4}) run(Config{"dense 8192", 8192, 8192, bits}, 64, T, hbm, filter, more);
  std::printf("prefill: custom kernel against cuBLAS FP32 (matmul switches at T >= %d for bf16, %d affine):\n",
              cuda::kGemmMinTokensBf16, cuda::kGemmMinTokensAffine);
  for (int bits : {16, 4})
    for (int T : {64, 512})
      for (Config c : {Config{"dense 8192", 8192, 8192, 0}, Config{"lm_head 151936", 151936, 2048, 0}}) {
        c.bits = bits;
        run_prefill(c, T, filter);
      }
  std::printf("crossover sweep:\n");
  for (int bits : {16, 4})
    for (Config c : {Config{"dense 8192", 8192, 8192, 0}, Config{"in_proj 12288x2048", 12288, 2048, 0},
                     Config{"o_proj 2048x4096", 2048, 4096, 0}, Config{"shared expert 512x2048", 512, 2048, 0}})
      for (int T : {4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256}) {
        if (bits == 16 && T > 96) continue;  // bf16 crosses over at T = 24..32
        c.bits = bits;
        run_prefill(c, T, filter);
      }
  std::printf("prefill: a chunk's routed experts, per-expert launches against the integer GEMM:\n");
  for (int T : {128, 512, 2048}) run_prefill_experts(filter, 4, 64, ScaleType::BF16, T);
  run_prefill_experts(filter, 4, 32, ScaleType::F16, 512);  // Q4_0 experts
  run_prefill_experts(filter, 8, 32, ScaleType::F16, 512);  // Q8_0 experts
  for (int bits : {8, 4, 3, 2}) run_moe(hbm, filter, bits);
  run_moe(hbm, filter, 4, 32, ScaleType::BF16);
  run_moe(hbm, filter, 4, 32, ScaleType::F16);  // Q4_0 experts
  run_moe(hbm, filter, 4, 32, ScaleType::F32);  // Q4_K
  run_moe(hbm, filter, 6, 16, ScaleType::F32);  // Q6_K
  run_route(filter);
  run_delta_rule(filter);
  return 0;
}
