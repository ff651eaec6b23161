#include "model/forward.h"

#include <algorithm>

#include "quant/affine.h"
#include "util/error.h"
#include "util/half.h"

namespace ms {

void check_token_ids(const ModelConfig& cfg, const int* ids, int T) {
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= cfg.vocab)
      fail("token id {} at position {} is outside the vocabulary [0, {})", ids[t], t, cfg.vocab);
}

void embed_tokens(const ModelConfig& cfg, const ModelWeights& w, const int* ids, int T, float* out) {
  check_token_ids(cfg, ids, T);
  const size_t H = size_t(cfg.hidden);
  for (int t = 0; t < T; ++t) {
    const size_t row = size_t(ids[t]) * H;
    float* o = out + size_t(t) * H;
    if (w.embed.type == WeightType::Affine) {
      dequantize_row(w.embed.quant(), ids[t], o);
    } else if (w.embed.type == WeightType::BF16) {
      const bf16* src = static_cast<const bf16*>(w.embed.data) + row;
      for (size_t h = 0; h < H; ++h) o[h] = bf16_to_f32(src[h]);
    } else {
      std::copy_n(static_cast<const float*>(w.embed.data) + row, H, o);
    }
  }
}

}  // namespace ms
