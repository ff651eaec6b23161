#pragma once
// One routed expert of one token on the CPU in the bits cuda::int_experts and
// cuda::int_expert_records give on the GPU: gate and up by int_matmul (kernels/int_dot.h's
// product), int_dot::silu(gate)·up, down by int_matmul, times the routing weight. What lets the
// hybrid decode compute some of a layer's experts on the CPU without changing the answer.
#include <span>

#include "quant/affine.h"

namespace ms::cpu {

// Whether int_expert takes these projections: each int_matmul_supported, gate and up of one
// layout and shape [I, H], down [H, I].
bool int_expert_supported(const QuantMat& gate, const QuantMat& up, const QuantMat& down);

// out [H] = weight · down(silu(gate·x) · (up·x)), x [H]. Threaded over rows (int_matmul's);
// throws naming the layouts where int_expert_supported is false.
void int_expert(const float* x, const QuantMat& gate, const QuantMat& up, const QuantMat& down, float weight,
                float* out);

// y [n, H] = down(silu(gate·x) · (up·x)) for n tokens x [n, H], unweighted (the GPU scales each
// user's row as it scatters them, one rounding as int_expert's): int_expert's bits token by token
// (a prompt chunk's expert the hybrid prefill computes on the CPU).
void int_expert_tokens(const float* x, int n, const QuantMat& gate, const QuantMat& up, const QuantMat& down, float* y);

// One expert of int_experts: its projections, routing weight and output row [H].
struct IntExpertJob {
  QuantMat gate, up, down;
  float weight = 1.f;
  float* out = nullptr;
};

// int_expert for each job on one x, bit for bit: x split once for all gates and ups, whose rows
// are shared out over the threads in one pass (a hybrid decode layer's CPU experts). The jobs'
// projections must share one layout.
void int_experts(const float* x, std::span<const IntExpertJob> jobs);

}  // namespace ms::cpu
