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

  typename B::Buf q_raw = be.alloc(size_t(T) * size_t(w.q_proj.rows));
  be.matmul(x, T, be.mat(w.q_proj), q_raw.data());
  // Qwen3-Next's q_proj gives, per head, hd query values then hd gate values.
  typename B::Buf q = gated ? be.alloc(size_t(T) * q_width) : std::move(q_raw), gate;
  if (gated) {
    gate = be.alloc(size_t(T) * q_width);
    const size_t rows = size_t(T) * size_t(nh);
    be.copy_rows(q.data(), size_t(hd), q_raw.data(), 2 * size_t(hd), size_t(hd), rows);
    be.copy_rows(gate.data(), size_t(hd), q_raw.data() + hd, 2 * size_t(hd), size_t(hd), rows);
  }

  const size_t kv_width = size_t(nkv) * size_t(hd);
  typename B::Buf k = be.alloc(size_t(T) * kv_width), v = be.alloc(size_t(T) * kv_width);
  be.matmul(x, T, be.mat(w.k_proj), k.data());
  be.matmul(x, T, be.mat(w.v_proj), v.data());
  be.rmsnorm(q.data(), T * nh, hd, be.vec(w.q_norm), norm_offset, cfg.rms_eps, q.data());
  be.rmsnorm(k.data(), T * nkv, hd, be.vec(w.k_norm), norm_offset, cfg.rms_eps, k.data());
  be.rope(q.data(), T, nh, hd, cfg.rotary_dim(), pos0, cfg.rope_theta);
  be.rope(k.data(), T, nkv, hd, cfg.rotary_dim(), pos0, cfg.rope_theta);
  // Through store_kv, not written in place: on the GPU the position may be known only there.
  cache.reserve(pos0 + T);
  be.store_kv(cache, pos0, T, k.data(), v.data());
  cache.length = pos0 + T;

  typename B::Buf attn = be.alloc(q.size());
  be.attention(q.data(), cache.k_at(0), cache.v_at(0), T, pos0, nh, nkv, hd, attn.data());
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
