// Decode matvec (T = 1) on the GPU: achieved bandwidth of cuda::matmul for bf16 and affine
// 2/3/4/8-bit weights, expert-sized and dense-sized, against the HBM bandwidth measured in the
// same run by a device-to-device copy. Each shape is replicated over enough copies that their
// sum is well past the L2 cache, and the calls cycle over the copies, as a decode step's experts
// and layers do. Bytes counted: weights, scales and biases, x read and y written.
// Also the Gated DeltaNet rule at Qwen3-Next-80B's shape, recurrent against chunked, over T: where
// gated_delta_rule switches from one to the other (kDeltaChunkedMinTokens) and what prefill costs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/deltanet.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"

using namespace ms;

namespace {

constexpr size_t kWorkingSet = size_t(1) << 30;  // bytes of weights cycled over: 20x the L2

// Milliseconds per call of fn(i), over calls covering at least min_ms, after one warm-up round.
template <class F>
double time_ms(int rounds, F&& fn) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  fn(0);
  CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < rounds; ++i) fn(i);
  CUDA_CHECK(cudaEventRecord(b));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return double(ms) / rounds;
}

// Device-to-device copy bandwidth, counting bytes read and written.
double copy_gbps() {
  const size_t bytes = size_t(2) << 30;
  cuda::DeviceBuffer src(bytes), dst(bytes);
  CUDA_CHECK(cudaMemset(src.data(), 1, bytes));
  const double ms = time_ms(10, [&](int) { CUDA_CHECK(cudaMemcpy(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice)); });
  return 2.0 * double(bytes) / (ms * 1e6);
}

struct Config {
  const char* name;
  int rows, cols, bits;  // bits 16: bf16
};

void run(const Config& c, int group, int T, double hbm, const std::string& filter) {
  const std::string type = c.bits == 16 ? "bf16" : "q" + std::to_string(c.bits) + " g" + std::to_string(group);
  if ((std::string(c.name) + " " + type).find(filter) == std::string::npos) return;
  const size_t q_bytes = size_t(c.rows) * c.cols * c.bits / 8;
  const size_t sb_bytes = c.bits == 16 ? 0 : size_t(c.rows) * (c.cols / group) * 2;
  const size_t per_copy = q_bytes + 2 * sb_bytes;
  const int copies = int(std::max<size_t>(1, kWorkingSet / per_copy));
  cuda::DeviceBuffer q(q_bytes * copies), sb(2 * sb_bytes * copies + 2), x(size_t(T) * c.cols * 4),
      y(size_t(T) * c.rows * 4);
  CUDA_CHECK(cudaMemset(q.data(), 0x5a, q.size()));
  CUDA_CHECK(cudaMemset(sb.data(), 0x3c, sb.size()));  // bf16 0x3c3c ≈ 0.0115
  CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.size()));
  std::vector<Mat> mats;
  for (int i = 0; i < copies; ++i) {
    const auto* s = reinterpret_cast<const uint16_t*>(sb.as<uint8_t>() + 2 * sb_bytes * i);
    if (c.bits == 16)
      mats.push_back(Mat{WeightType::BF16, q.as<uint8_t>() + q_bytes * i, c.rows, c.cols});
    else
      mats.push_back(Mat{WeightType::Affine, q.as<uint8_t>() + q_bytes * i, c.rows, c.cols, c.bits, group, s,
                         s + sb_bytes / 2});
  }
  const int rounds = std::max(copies, std::min(2000, int(20e9 / double(per_copy))));
  const double ms = time_ms(rounds, [&](int i) { cuda::matmul(x.as<float>(), T, mats[size_t(i % copies)], y.as<float>()); });
  const double bytes = double(per_copy) + 4.0 * T * (c.cols + c.rows);
  const double gbps = bytes / (ms * 1e6);
  std::printf("%-22s %6d x %-6d %-8s T=%-2d %9.2f us %8.0f GB/s %5.1f%% of copy\n", c.name, c.rows, c.cols,
              type.c_str(), T, ms * 1e3, gbps, 100.0 * gbps / hbm);
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
  cuda::DeviceBuffer dq = cuda::DeviceBuffer::from(qk), dk = cuda::DeviceBuffer::from(qk),
                     dv = cuda::DeviceBuffer::from(v), dg = cuda::DeviceBuffer::from(g),
                     db = cuda::DeviceBuffer::from(beta), dst = cuda::DeviceBuffer::from(state),
                     dout(v.size() * sizeof(float));
  std::printf("gated_delta_rule, %d/%d heads, dk = dv = %d (chunked from T >= %d):\n", hk, hv, d,
              cuda::kDeltaChunkedMinTokens);
  for (int T : {1, 2, 4, 8, 12, 16, 24, 32, 64, 128, 256, 1024, 4096}) {
    const int rounds = std::max(3, 2000 / T);
    double us[2];
    int i = 0;
    for (auto fn : {cuda::gated_delta_rule_recurrent, cuda::gated_delta_rule_chunked})
      us[i++] = 1e3 * time_ms(rounds, [&](int) {
                  fn(dq.as<float>(), dk.as<float>(), dv.as<float>(), dg.as<float>(), db.as<float>(), T, hk, hv, d, d,
                     dst.as<float>(), dout.as<float>());
                });
    std::printf("  T=%-5d recurrent %10.1f us  chunked %10.1f us  (%.2fx)\n", T, us[0], us[1], us[0] / us[1]);
  }
}

}  // namespace

// Optional argument: run only the cases whose "name type" contains it (e.g. "lm_head 151936 q4",
// "gated_delta_rule").
int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  if (!cuda::cuda_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double hbm = copy_gbps();
  std::printf("%s, %d SMs, L2 %d MB; device-to-device copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, hbm);
  const Config shapes[] = {{"expert gate/up", 512, 2048, 0},  {"expert down", 2048, 512, 0},
                           {"expert (Qwen3-30B) up", 768, 2048, 0}, {"dense 4096", 4096, 4096, 0},
                           {"dense 8192", 8192, 8192, 0},     {"lm_head 151936", 151936, 2048, 0}};
  for (int bits : {16, 8, 4, 3, 2})
    for (Config c : shapes) {
      c.bits = bits;
      run(c, 64, 1, hbm, filter);
    }
  std::printf("prefill/verify batches (weights reused by 4 tokens a block):\n");
  for (int T : {4, 16})
    for (int bits : {16, 4}) run(Config{"dense 8192", 8192, 8192, bits}, 64, T, hbm, filter);
  run_delta_rule(filter);
  return 0;
}
