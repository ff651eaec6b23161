#include <algorithm>

#include "model/backend_cpu.h"
#include "model/backend_cuda.h"
#include "model/blocks.h"

namespace ms {

void CpuBackend::attention_prepare(const float* q_raw, const float* k, const float* v, int T, int nh, int nkv, int hd,
                                   bool gated, const float* q_norm, const float* k_norm, float offset, float eps,
                                   int rot_dim, int pos0, double theta, float* q, float* gate, KV& cache) const {
  const size_t rows = size_t(T) * size_t(nh), kv_size = size_t(T) * size_t(nkv) * size_t(hd);
  if (gated) {
    copy_rows(q, size_t(hd), q_raw, 2 * size_t(hd), size_t(hd), rows);
    copy_rows(gate, size_t(hd), q_raw + hd, 2 * size_t(hd), size_t(hd), rows);
  } else {
    std::copy_n(q_raw, rows * size_t(hd), q);
  }
  Buf kn(kv_size);
  rmsnorm(q, int(rows), hd, q_norm, offset, eps, q);
  rmsnorm(k, T * nkv, hd, k_norm, offset, eps, kn.data());
  rope(q, T, nh, hd, rot_dim, pos0, theta);
  rope(kn.data(), T, nkv, hd, rot_dim, pos0, theta);
  store_kv(cache, pos0, T, kn.data(), v);
}

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

template void attention_block(const CpuBackend&, const ModelConfig&, const AttentionWeights&, const float*, int,
                              KVCache&, int, float*);
#if MOESTREAM_CUDA
template void attention_block(const CudaBackend&, const ModelConfig&, const AttentionWeights&, const float*, int,
                              DeviceKV&, int, float*);
#endif

}  // namespace ms
