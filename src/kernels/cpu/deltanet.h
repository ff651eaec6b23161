#pragma once
// Kernels of Qwen3-Next's Gated DeltaNet (linear attention) layers, float32, row-major.
// T is the number of new tokens of one sequence; the conv and recurrent states carry a
// sequence across calls, so a prompt may be fed in any number of pieces with the same result.

namespace ms::cpu {

// Depthwise causal conv over time, then SiLU. x: [T, C]; w: [C, K] (HF conv1d.weight [C,1,K],
// no bias); state: [C, K-1], the previous K-1 inputs of each channel, oldest first (zeros at the
// start of a sequence). out[t,c] = silu(sum_j w[c,j] * xx[t+j,c]) with xx = state ++ x, so
// w[c,K-1] multiplies the current input. Afterwards state holds the last K-1 inputs. out: [T, C].
void causal_conv1d_silu(const float* x, int T, int C, const float* w, int K, float* state, float* out);

// The gated delta rule (HF torch_recurrent_gated_delta_rule), per value head h and token t:
//   S = S * exp(g_t);  delta = (v_t - k_t^T S) * beta_t;  S = S + k_t delta^T;  o_t = q_t^T S.
// q, k: [T, n_k_heads, dk], already L2-normalised, q already scaled by 1/sqrt(dk); v: [T,
// n_v_heads, dv]; g (log-decay, <= 0), beta: [T, n_v_heads]. Value head h reads key head
// h / (n_v_heads / n_k_heads). state: [n_v_heads, dk, dv], updated in place; out: [T, n_v_heads, dv].
// T == 1 runs the recurrent update; T > 1 the chunked (WY / UT-transform) form, 64 tokens a chunk.
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                      int T, int n_k_heads, int n_v_heads, int dk, int dv, float* state, float* out);

// The recurrence above token by token, written for clarity: what gated_delta_rule is tested against.
void gated_delta_rule_reference(const float* q, const float* k, const float* v, const float* g,
                                const float* beta, int T, int n_k_heads, int n_v_heads, int dk, int dv,
                                float* state, float* out);

// In place, each row of dim: x *= 1 / sqrt(sum(x^2) + eps) (HF l2norm; eps 1e-6 there).
void l2norm_heads(float* x, int rows, int dim, float eps);

// HF Qwen3NextRMSNormGated, each row of dim: out = w * (x / sqrt(mean(x^2) + eps)) * silu(z).
// out may be x (in place).
void rmsnorm_gated(const float* x, const float* z, const float* w, int rows, int dim, float eps, float* out);

}  // namespace ms::cpu
