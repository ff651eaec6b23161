#pragma once
// The blocks of a decoder layer, written once over a backend B (model/backend_cpu.h,
// model/backend_cuda.h) that holds the activations and runs the kernels. Each reads the normed
// hidden states x [T, hidden] of T consecutive tokens and writes its contribution out [T, hidden]
// (the caller adds the residual); x and out live where B keeps activations.
#include "model/state.h"
#include "model/weights.h"

namespace ms {

// Grouped-query attention with per-head q/k RMSNorm and (partial) RoPE over the KV cache;
// Qwen3-Next's variant also gates the output with sigmoid(gate) from q_proj.
template <class B>
void attention_block(const B& be, const ModelConfig& cfg, const AttentionWeights& w, const float* x, int T,
                     typename B::KV& cache, int pos0, float* out);

// Gated DeltaNet: projections, causal conv1d, delta-rule recurrence, gated RMSNorm, out_proj.
template <class B>
void deltanet_block(const B& be, const ModelConfig& cfg, const DeltaNetWeights& w, const float* x, int T,
                    typename B::Linear& state, float* out);

// Dense SwiGLU MLP, or the MoE: router softmax -> top-k -> routed experts (+ gated shared
// expert). routes, when given, receives the T*top_k routed expert ids in top-k order, and
// router_probs the T*n_experts router probabilities (both host memory).
// Streamed experts (w.store_layer >= 0) come from the backend's expert store, in waves of at most
// the layer's pool capacity when the batch routes more distinct experts than that.
template <class B>
void ffn_block(const B& be, const ModelConfig& cfg, const FfnWeights& w, bool moe, const float* x, int T, float* out,
               int* routes = nullptr, float* router_probs = nullptr);

// out[T, inter -> hidden] = down(silu(gate x) * up x); w as the backend's kernels take it (be.mlp).
template <class B>
void mlp_forward(const B& be, const MlpWeights& w, const float* x, int T, float* out);
// The same in the caller's h and u ([T, inter] each; u unused where the backend fuses gate and
// up), for work that may not take memory (a cuda::SideStream's).
template <class B>
void mlp_forward(const B& be, const MlpWeights& w, const float* x, int T, float* h, float* u, float* out);

}  // namespace ms
