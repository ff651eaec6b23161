#include "model/backend_cpu.h"
#include "model/backend_cuda.h"
#include "model/blocks.h"

namespace ms {

template <class B>
void attention_block(const B& be, const ModelConfig& cfg, const AttentionWeights& w, const float* x, int T,
                     typename B::KV& cache, int pos0, float* out) {
  const int nh = cfg.n_heads, nkv = cfg.n_kv_heads, hd = cfg.head_dim;
  const bool gated = cfg.arch == Arch::Qwen3Next;
  const float norm_offset = cfg.zero_centred_norms() ? 1.f : 0.f;
  const size_t q_width = size_t(nh) * size_t(hd);

  const size_t kv_width = size_t(nkv) * size_t(hd);
  typename B::Buf proj = be.alloc(size_t(T) * (size_t(w.q_proj.rows) + 2 * kv_width));
  be.matmul_stack(x, T, {&w.q_proj, &w.k_proj, &w.v_proj}, proj.data());
  float* q_raw = proj.data();
  float* k = q_raw + size_t(T) * size_t(w.q_proj.rows);
  const float* v = k + size_t(T) * kv_width;
  // Qwen3-Next's q_proj gives, per head, hd query values then hd gate values.
  typename B::Buf q_gated, gate;
  float* q = q_raw;
  if (gated) {
    q_gated = be.alloc(size_t(T) * q_width), gate = be.alloc(size_t(T) * q_width);
    const size_t rows = size_t(T) * size_t(nh);
    be.copy_rows(q_gated.data(), size_t(hd), q_raw, 2 * size_t(hd), size_t(hd), rows);
    be.copy_rows(gate.data(), size_t(hd), q_raw + hd, 2 * size_t(hd), size_t(hd), rows);
    q = q_gated.data();
  }

  be.rmsnorm(q, T * nh, hd, be.vec(w.q_norm), norm_offset, cfg.rms_eps, q);
  be.rmsnorm(k, T * nkv, hd, be.vec(w.k_norm), norm_offset, cfg.rms_eps, k);
  be.rope(q, T, nh, hd, cfg.rotary_dim(), pos0, cfg.rope_theta);
  be.rope(k, T, nkv, hd, cfg.rotary_dim(), pos0, cfg.rope_theta);
  // Through store_kv, not written in place: on the GPU the position may be known only there.
  cache.reserve(pos0 + T);
  be.store_kv(cache, pos0, T, k, v);
  cache.length = pos0 + T;

  typename B::Buf attn = be.alloc(size_t(T) * q_width);
  be.attention(q, cache.k_at(0), cache.v_at(0), T, pos0, nh, nkv, hd, attn.data());
  if (gated) be.sigmoid_mul(attn.data(), gate.data(), attn.size());
  be.matmul(attn.data(), T, be.mat(w.o_proj), out);
}

template void attention_block(const CpuBackend&, const ModelConfig&, const AttentionWeights&, const float*, int,
                              KVCache&, int, float*);
#if MOESTREAM_CUDA
template void attention_block(const CudaBackend&, const ModelConfig&, const AttentionWeights&, const float*, int,
                              DeviceKV&, int, float*);
#endif

}  // namespace ms
