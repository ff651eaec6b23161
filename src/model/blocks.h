#pragma once
// The blocks of a decoder layer, written once over a Backend B (model/backend.h) that holds the
// activations and runs the kernels. Each reads the normed hidden states x [T, hidden] of T
// consecutive tokens and writes its contribution out [T, hidden] (the caller adds the residual);
// x and out live where B keeps activations.
#include <cmath>

#include "model/backend.h"
#include "model/state.h"
#include "model/weights.h"

namespace ms {

// Grouped-query attention with per-head q/k RMSNorm and (partial) RoPE over the KV cache;
// Qwen3-Next's variant also gates the output with sigmoid(gate) from q_proj.
template <Backend B>
void attention_block(const B& be, const ModelConfig& cfg, const AttentionWeights& w, const float* x, int T,
                     typename B::KV& cache, int pos0, float* out) {
  const int nh = cfg.n_heads, nkv = cfg.n_kv_heads, hd = cfg.head_dim;
  const bool gated = cfg.arch == Arch::Qwen3Next;
  const float norm_offset = cfg.zero_centred_norms() ? 1.f : 0.f;
  const size_t q_width = size_t(nh) * size_t(hd), kv_width = size_t(nkv) * size_t(hd);

  typename B::Buf proj = be.alloc(size_t(T) * (size_t(w.q_proj.rows) + 2 * kv_width));
  be.matmul_stack(x, T, {&w.q_proj, &w.k_proj, &w.v_proj}, proj.data());
  const float* q_raw = proj.data();
  const float* k = q_raw + size_t(T) * size_t(w.q_proj.rows);
  const float* v = k + size_t(T) * kv_width;
  // Qwen3-Next's q_proj gives, per head, hd query values then hd gate values.
  typename B::Buf q = be.alloc(size_t(T) * q_width), gate = gated ? be.alloc(size_t(T) * q_width) : typename B::Buf{};
  cache.reserve(pos0 + T);
  be.attention_prepare(q_raw, k, v, T, nh, nkv, hd, gated, be.vec(w.q_norm), be.vec(w.k_norm), norm_offset, cfg.rms_eps,
                       cfg.rotary_dim(), pos0, cfg.rope_theta, q.data(), gate.data(), cache);
  cache.length = pos0 + T;

  typename B::Buf attn = be.alloc(size_t(T) * q_width);
  be.attention(q.data(), cache, T, pos0, nh, nkv, hd, gated ? gate.data() : nullptr, attn.data());
  be.matmul(attn.data(), T, be.mat(w.o_proj), out);
}

// Gated DeltaNet: projections, causal conv1d, delta-rule recurrence, gated RMSNorm, out_proj.
template <Backend B>
void deltanet_block(const B& be, const ModelConfig& cfg, const DeltaNetWeights& w, const float* x, int T,
                    typename B::Linear& state, float* out) {
  const int nk = cfg.lin_k_heads, nv = cfg.lin_v_heads, dk = cfg.lin_k_dim, dv = cfg.lin_v_dim;
  const size_t key_dim = size_t(nk) * size_t(dk), value_dim = size_t(nv) * size_t(dv);
  const size_t tokens = size_t(T);

  typename B::Buf proj = be.alloc(tokens * size_t(w.in_proj_qkvz.rows + w.in_proj_ba.rows));
  be.matmul_stack(x, T, {&w.in_proj_qkvz, &w.in_proj_ba}, proj.data());
  const float* qkvz = proj.data();
  const float* ba = qkvz + tokens * size_t(w.in_proj_qkvz.rows);

  typename B::Buf q = be.alloc(tokens * key_dim), k = be.alloc(tokens * key_dim), v = be.alloc(tokens * value_dim),
                  z = be.alloc(tokens * value_dim), g = be.alloc(tokens * size_t(nv)), beta = be.alloc(tokens * size_t(nv));
  be.deltanet_prepare(qkvz, ba, T, nk, nv, dk, dv, be.vec(w.conv1d), cfg.conv_kernel, state.conv.data(),
                      be.vec(w.A_log), be.vec(w.dt_bias), 1e-6f, 1.0f / std::sqrt(float(dk)), q.data(), k.data(),
                      v.data(), z.data(), g.data(), beta.data());

  typename B::Buf o = be.alloc(tokens * value_dim);
  be.gated_delta_rule(q.data(), k.data(), v.data(), g.data(), beta.data(), T, nk, nv, dk, dv, state.recurrent.data(),
                      o.data());
  be.rmsnorm_gated(o.data(), z.data(), be.vec(w.norm), T * nv, dv, cfg.rms_eps, o.data());
  be.matmul(o.data(), T, be.mat(w.out_proj), out);
}

// Dense SwiGLU MLP, or the MoE (Backend::moe). routes, when given, receives the T*top_k routed
// expert ids in top-k order, and router_probs the T*n_experts router probabilities (host memory).
template <Backend B>
void ffn_block(const B& be, const ModelConfig& cfg, const FfnWeights& w, bool moe, const float* x, int T, float* out,
               int* routes = nullptr, float* router_probs = nullptr) {
  if (moe) be.moe(cfg, w, x, T, out, routes, router_probs);
  else be.mlp(be.mlp_weights(w.dense), x, T, out);
}

}  // namespace ms
