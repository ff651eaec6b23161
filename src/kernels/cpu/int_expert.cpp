// cpu::int_expert. Compiled without floating-point contraction (CMakeLists.txt): the activation's
// steps must round one by one as they do on the GPU (int_dot.h).
#include "kernels/cpu/int_expert.h"

#include <vector>

#include "kernels/cpu/int_matmul.h"
#include "kernels/int_dot.h"
#include "util/error.h"

namespace ms::cpu {

bool int_expert_supported(const QuantMat& gate, const QuantMat& up, const QuantMat& down) {
  return int_matmul_supported(gate) && int_matmul_supported(up) && int_matmul_supported(down) &&
         int_dot::expert_shapes_match(gate, up, down);
}

namespace {

void require_supported(const QuantMat& gate, const QuantMat& up, const QuantMat& down) {
  if (!int_expert_supported(gate, up, down))
    fail("cpu::int_expert: no integer kernel for gate/up {}-bit group {} {} [{}, {}] and down {}-bit group {} {} [{}, {}]",
         gate.bits, gate.group, scale_type_name(gate.scale_type), gate.rows, gate.cols, down.bits, down.group,
         scale_type_name(down.scale_type), down.rows, down.cols);
}

// g[i] = silu(g[i])·u[i]: the gate's activation times the up projection, in place.
void gate_times_up(float* g, const float* u, size_t n) {
  for (size_t i = 0; i < n; ++i) g[i] = int_dot::silu(g[i]) * u[i];
}

}  // namespace

void int_expert(const float* x, const QuantMat& gate, const QuantMat& up, const QuantMat& down, float weight,
                float* out) {
  const IntExpertJob job{gate, up, down, weight, out};
  int_experts(x, {&job, 1});
}

void int_expert_tokens(const float* x, int n, const QuantMat& gate, const QuantMat& up, const QuantMat& down,
                       float* y) {
  require_supported(gate, up, down);
  if (n <= 0) return;
  thread_local std::vector<float> h, u;
  const size_t I = size_t(gate.rows) * size_t(n);
  h.resize(I), u.resize(I);
  const QuantMat mats[] = {gate, up};
  float* const outs[] = {h.data(), u.data()};
  int_matmul_each(x, n, mats, outs);
  gate_times_up(h.data(), u.data(), I);
  int_matmul(h.data(), n, down, y);
}

void int_experts(const float* x, std::span<const IntExpertJob> jobs) {
  if (jobs.empty()) return;
  for (const IntExpertJob& j : jobs) require_supported(j.gate, j.up, j.down);
  const size_t n = jobs.size(), I = size_t(jobs[0].gate.rows), H = size_t(jobs[0].down.rows);
  // Gate and up of every job from one split of x: h = [gate_0, up_0, gate_1, up_1, ...].
  thread_local std::vector<float> h;
  thread_local std::vector<QuantMat> mats;
  thread_local std::vector<float*> outs;
  h.resize(2 * n * I), mats.clear(), outs.clear();
  for (size_t j = 0; j < n; ++j) {
    mats.push_back(jobs[j].gate), mats.push_back(jobs[j].up);
    outs.push_back(h.data() + 2 * j * I), outs.push_back(h.data() + (2 * j + 1) * I);
  }
  int_matmul_each(x, 1, mats, outs);
  for (size_t j = 0; j < n; ++j) {
    float* g = h.data() + 2 * j * I;
    gate_times_up(g, g + I, I);
    int_matmul(g, 1, jobs[j].down, jobs[j].out);
    for (size_t i = 0; i < H; ++i) jobs[j].out[i] = jobs[j].weight * jobs[j].out[i];
  }
}

}  // namespace ms::cpu
