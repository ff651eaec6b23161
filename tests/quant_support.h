#pragma once
// Affine weights in the scale types imports carry (f16 and f32, quant/affine.h's ScaleType), for
// the kernel tests of the CPU and the GPU alike.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/affine.h"
#include "util/half.h"

namespace ms::test {

// A QuantBuffer's scales and biases as another type, and the view that reads them.
struct TypedScales {
  std::vector<uint16_t> scales, biases;  // of type t (f32: two words each)
  QuantMat view;
};

// qb's scales and biases as type t, each nudged off the bf16 grid (by up to 2^-9 relative) so
// that f16 and f32 carry bits bf16 lacks, as imported GGUF scales do.
inline TypedScales with_scale_type(const QuantBuffer& qb, ScaleType t, std::mt19937& rng) {
  TypedScales out;
  const size_t n = qb.scales.size(), words = scale_size(t) / 2;
  out.scales.resize(n * words);
  out.biases.resize(n * words);
  std::uniform_real_distribution<float> nudge(-1.0f / 512, 1.0f / 512);
  auto put = [&](std::vector<uint16_t>& dst, size_t i, float v) {
    v *= 1.0f + nudge(rng);
    if (t == ScaleType::F32) std::memcpy(&dst[2 * i], &v, 4);
    else if (t == ScaleType::F16) dst[i] = f32_to_f16(v);
    else dst[i] = f32_to_bf16(v);
  };
  for (size_t i = 0; i < n; ++i) {
    put(out.scales, i, bf16_to_f32(qb.scales[i]));
    put(out.biases, i, bf16_to_f32(qb.biases[i]));
  }
  out.view = qb.view();
  out.view.scales = out.scales.data();
  out.view.biases = out.biases.data();
  out.view.scale_type = t;
  return out;
}

}  // namespace ms::test
