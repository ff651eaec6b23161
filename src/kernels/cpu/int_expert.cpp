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
         gate.bits == up.bits && gate.group == up.group && gate.scale_type == up.scale_type && gate.rows == up.rows &&
         gate.cols == up.cols && down.rows == gate.cols && down.cols == gate.rows;
}

void int_expert(const float* x, const QuantMat& gate, const QuantMat& up, const QuantMat& down, float weight,
                float* out) {
  if (!int_expert_supported(gate, up, down))
    fail("cpu::int_expert: no integer kernel for gate/up {}-bit group {} {} [{}, {}] and down {}-bit group {} {} [{}, {}]",
         gate.bits, gate.group, scale_type_name(gate.scale_type), gate.rows, gate.cols, down.bits, down.group,
         scale_type_name(down.scale_type), down.rows, down.cols);
  thread_local std::vector<float> h, u;
  const size_t I = size_t(gate.rows), H = size_t(down.rows);
  h.resize(I), u.resize(I);
  int_matmul(x, 1, gate, h.data());
  int_matmul(x, 1, up, u.data());
  for (size_t i = 0; i < I; ++i) h[i] = int_dot::silu(h[i]) * u[i];
  int_matmul(h.data(), 1, down, out);
  for (size_t i = 0; i < H; ++i) out[i] = weight * out[i];
}

}  // namespace ms::cpu
