#pragma once
// A weight matrix as the kernels see it: [rows = outputs, cols = inputs], row-major, in the
// dtype it is stored in. The data is borrowed (mmap'ed checkpoint, expert slot, or owned buffer).
#include <cstdint>

#include "quant/affine.h"

namespace ms {

// Affine: affine group quantization (quant/affine.h); data is the packed q bit streams.
enum class WeightType { F32, BF16, Affine };

struct Mat {
  WeightType type = WeightType::F32;
  const void* data = nullptr;
  int rows = 0;
  int cols = 0;
  // Affine only.
  int bits = 0, group = 0;
  const uint16_t* scales = nullptr;
  const uint16_t* biases = nullptr;
  ScaleType scale_type = ScaleType::BF16;

  static Mat affine(const QuantMat& q) {
    return {WeightType::Affine, q.q, q.rows, q.cols, q.bits, q.group, q.scales, q.biases, q.scale_type};
  }
  QuantMat quant() const {
    return {static_cast<const uint8_t*>(data), scales, biases, rows, cols, bits, group, scale_type};
  }
};

}  // namespace ms
