#pragma once
// The blocks of a decoder layer, written once over a Backend B (model/backend.h) that holds the
// activations and runs the kernels. Each reads the normed hidden states x [T, hidden] of T
// consecutive tokens and writes its contribution out [T, hidden] (the caller adds the residual);
// x and out live where B keeps activations.
#include <cmath>

#include "model/backend.h"
#include "model/state.h"
#include "model/weights.h"
#include "util/error.h"

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

// Where deltanet_with keeps a block's rows, and each row's width.
struct DeltaRows {
  const float *qkvz, *ba;
  float *q, *k, *v, *z, *g, *beta, *o;
  size_t qkvz_w, ba_w, key_w, value_w, heads_w;
};

// Gated DeltaNet: projections, causal conv1d, delta-rule recurrence, gated RMSNorm, out_proj.
// `recurrence` runs the conv and the delta rule over the prepared rows (deltanet_rows below).
template <Backend B, class Recurrence>
void deltanet_with(const B& be, const ModelConfig& cfg, const DeltaNetWeights& w, const float* x, int T, float* out,
                   const Recurrence& recurrence) {
  const int nk = cfg.lin_k_heads, nv = cfg.lin_v_heads, dk = cfg.lin_k_dim, dv = cfg.lin_v_dim;
  const size_t key_dim = size_t(nk) * size_t(dk), value_dim = size_t(nv) * size_t(dv);
  const size_t tokens = size_t(T);

  typename B::Buf proj = be.alloc(tokens * size_t(w.in_proj_qkvz.rows + w.in_proj_ba.rows));
  be.matmul_stack(x, T, {&w.in_proj_qkvz, &w.in_proj_ba}, proj.data());
  const float* qkvz = proj.data();
  const float* ba = qkvz + tokens * size_t(w.in_proj_qkvz.rows);

  typename B::Buf q = be.alloc(tokens * key_dim), k = be.alloc(tokens * key_dim), v = be.alloc(tokens * value_dim),
                  z = be.alloc(tokens * value_dim), g = be.alloc(tokens * size_t(nv)), beta = be.alloc(tokens * size_t(nv));
  typename B::Buf o = be.alloc(tokens * value_dim);
  recurrence(DeltaRows{qkvz, ba, q.data(), k.data(), v.data(), z.data(), g.data(), beta.data(), o.data(),
                       size_t(w.in_proj_qkvz.rows), size_t(w.in_proj_ba.rows), key_dim, value_dim, size_t(nv)});
  be.rmsnorm_gated(o.data(), z.data(), be.vec(w.norm), T * nv, dv, cfg.rms_eps, o.data());
  be.matmul(o.data(), T, be.mat(w.out_proj), out);
}

// The conv and delta rule over rows [t, t + n) of r, from the linear-attention state.
template <Backend B>
void deltanet_rows(const B& be, const ModelConfig& cfg, const DeltaNetWeights& w, const DeltaRows& r, int t, int n,
                   typename B::Linear& state) {
  const int nk = cfg.lin_k_heads, nv = cfg.lin_v_heads, dk = cfg.lin_k_dim, dv = cfg.lin_v_dim;
  const size_t at = size_t(t);
  be.deltanet_prepare(r.qkvz + at * r.qkvz_w, r.ba + at * r.ba_w, n, nk, nv, dk, dv, be.vec(w.conv1d), cfg.conv_kernel,
                      state.conv.data(), be.vec(w.A), be.vec(w.dt_bias), 1e-6f, 1.0f / std::sqrt(float(dk)),
                      r.q + at * r.key_w, r.k + at * r.key_w, r.v + at * r.value_w, r.z + at * r.value_w,
                      r.g + at * r.heads_w, r.beta + at * r.heads_w);
  be.gated_delta_rule(r.q + at * r.key_w, r.k + at * r.key_w, r.v + at * r.value_w, r.g + at * r.heads_w,
                      r.beta + at * r.heads_w, n, nk, nv, dk, dv, state.recurrent.data(), r.o + at * r.value_w);
}

// The block over T tokens at once (the chunked delta rule where T > 1).
template <Backend B>
void deltanet_block(const B& be, const ModelConfig& cfg, const DeltaNetWeights& w, const float* x, int T,
                    typename B::Linear& state, float* out) {
  deltanet_with(be, cfg, w, x, T, out, [&](const DeltaRows& r) { deltanet_rows(be, cfg, w, r, 0, T, state); });
}

// The block as speculative verification runs it (ForwardOptions::verify): token by token, each
// by the recurrent form a one-token decode step takes, the state after each but the last kept
// (Backend::keep_linear_step) for layer `layer`.
template <Backend B>
void verify_deltanet_block(const B& be, const ModelConfig& cfg, const DeltaNetWeights& w, const float* x, int T,
                           typename B::Linear& state, int layer, float* out) {
  if constexpr (!requires { be.keep_linear_step(state, 0, layer); }) {
    fail("speculative verification does not run on this backend");
  } else {
    deltanet_with(be, cfg, w, x, T, out, [&](const DeltaRows& r) {
      for (int t = 0; t < T; ++t) {
        deltanet_rows(be, cfg, w, r, t, 1, state);
        if (t + 1 < T) be.keep_linear_step(state, t, layer);
      }
    });
  }
}

// Dense SwiGLU MLP, or the MoE (Backend::moe). routes, when given, receives the T*top_k routed
// expert ids in top-k order, and router_probs the T*n_experts router probabilities (host memory);
// forced_routes (T*top_k, host memory) replace the router's top-k (ForwardOptions::routes_from).
template <Backend B>
void ffn_block(const B& be, const ModelConfig& cfg, const FfnWeights& w, bool moe, const float* x, int T, float* out,
               int* routes = nullptr, float* router_probs = nullptr, const int* forced_routes = nullptr) {
  if (moe) be.moe(cfg, w, x, T, out, routes, router_probs, forced_routes);
  else be.mlp(be.mlp_weights(w.dense), x, T, out);
}

}  // namespace ms
