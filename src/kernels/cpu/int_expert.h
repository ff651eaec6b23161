#pragma once
// One routed expert of one token on the CPU in the bits cuda::int_experts and
// cuda::int_expert_records give on the GPU: gate and up by int_matmul (kernels/int_dot.h's
// product), int_dot::silu(gate)·up, down by int_matmul, times the routing weight. What lets the
// hybrid decode compute some of a layer's experts on the CPU without changing the answer.
#include "quant/affine.h"

namespace ms::cpu {

// Whether int_expert takes these projections: each int_matmul_supported, gate and up of one
// layout and shape [I, H], down [H, I].
bool int_expert_supported(const QuantMat& gate, const QuantMat& up, const QuantMat& down);

// out [H] = weight · down(silu(gate·x) · (up·x)), x [H]. Threaded over rows (int_matmul's);
// throws naming the layouts where int_expert_supported is false.
void int_expert(const float* x, const QuantMat& gate, const QuantMat& up, const QuantMat& down, float weight,
                float* out);

}  // namespace ms::cpu
