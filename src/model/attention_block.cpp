#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/blocks.h"

namespace ms {

void attention_block(const ModelConfig& cfg, const AttentionWeights& w, const float* x, int T, KVCache& cache, int pos0,
                     float* out) {
  const int nh = cfg.n_heads, nkv = cfg.n_kv_heads, hd = cfg.head_dim;
  const bool gated = cfg.arch == Arch::Qwen3Next;
  const float norm_offset = cfg.zero_centred_norms() ? 1.f : 0.f;
  const size_t q_width = size_t(nh) * size_t(hd);

  std::vector<float> q_raw(size_t(T) * size_t(w.q_proj.rows));
  cpu::matmul(x, T, w.q_proj, q_raw.data());
  // Qwen3-Next's q_proj gives, per head, hd query values then hd gate values.
  std::vector<float> q(size_t(T) * q_width), gate;
  if (gated) {
    gate.resize(q.size());
    for (size_t th = 0; th < size_t(T) * size_t(nh); ++th) {
      const float* src = q_raw.data() + th * 2 * size_t(hd);
      std::copy(src, src + hd, q.data() + th * size_t(hd));
      std::copy(src + hd, src + 2 * hd, gate.data() + th * size_t(hd));
    }
  } else {
    q.swap(q_raw);
  }

  cache.reserve(pos0 + T);
  float* k = cache.k_at(pos0);
  float* v = cache.v_at(pos0);
  cpu::matmul(x, T, w.k_proj, k);
  cpu::matmul(x, T, w.v_proj, v);
  cpu::rmsnorm(q.data(), T * nh, hd, w.q_norm.data(), norm_offset, cfg.rms_eps, q.data());
  cpu::rmsnorm(k, T * nkv, hd, w.k_norm.data(), norm_offset, cfg.rms_eps, k);
  cpu::rope(q.data(), T, nh, hd, cfg.rotary_dim(), pos0, cfg.rope_theta);
  cpu::rope(k, T, nkv, hd, cfg.rotary_dim(), pos0, cfg.rope_theta);
  cache.length = pos0 + T;

  std::vector<float> attn(q.size());
  cpu::attention(q.data(), cache.k.data(), cache.v.data(), T, pos0, nh, nkv, hd, attn.data());
  if (gated)
    for (size_t i = 0; i < attn.size(); ++i) attn[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  cpu::matmul(attn.data(), T, w.o_proj, out);
}

}  // namespace ms
