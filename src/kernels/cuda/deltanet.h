#pragma once
// The two forms of cuda::gated_delta_rule (kernels/cuda/ops.h), named so that tests and benchmarks
// can run each on any T. Same arguments and results as gated_delta_rule; device pointers.
// Plain C++: no CUDA headers needed to include this.

namespace ms::cuda {

// gated_delta_rule runs the chunked form from this many tokens on (and where it fits, see below),
// the recurrence below it: at the 80B shape the two cross near T = 60 on the H200
// (docs/PERFORMANCE.md#cuda-gated-deltanet).
inline constexpr int kDeltaChunkedMinTokens = 60;

// The recurrence token by token: one block per (value head, 32 state columns), the state held in
// registers across the T tokens. dk up to 1024.
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                int T, int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out);

// The chunked (WY / UT-transform) form of kernels/cpu/deltanet.cpp, 64 tokens a chunk: the
// intra-chunk work for all chunks and heads at once, then the chunk-to-chunk state recurrence.
// Needs dk <= 160 and dk, dv multiples of 4 (chunked_delta_rule_fits); throws otherwise. Holds a
// device scratch buffer of up to 64 MiB between calls.
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              int T, int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out);

// Whether gated_delta_rule_chunked takes these head sizes and pointers (k, state, out 16-byte aligned).
bool chunked_delta_rule_fits(const float* k, int dk, int dv, const float* state, const float* out);

}  // namespace ms::cuda
