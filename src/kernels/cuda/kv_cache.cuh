#pragma once
// Reading one value of a KV cache row on the device (quant/kv_quant.h's formats): what
// kv_decode computes, the scale·q + bias fused.
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/ops.h"

namespace ms::cuda {

// Value d of row `row` (position · n_kv + head) of a cache side at base; hd values a row.
__device__ __forceinline__ float kv_value(const uint8_t* base, const KvSideView& s, size_t row, int hd, int d) {
  if (s.bits == 32) return reinterpret_cast<const float*>(base)[row * hd + d];
  if (s.bits == 16) return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(base)[row * hd + d]) << 16);
  const uint8_t* r = base + row * size_t(s.row_bytes);
  const int bit = d * s.bits, byte = bit >> 3, shift = bit & 7;
  uint32_t w = r[byte];
  if (shift + s.bits > 8) w |= uint32_t(r[byte + 1]) << 8;
  const float code = float((w >> shift) & ((1u << s.bits) - 1));
  const __half* params = reinterpret_cast<const __half*>(r + s.code_bytes);
  const int g = d / s.group, groups = hd / s.group;
  return fmaf(__half2float(params[g]), code, __half2float(params[groups + g]));
}

}  // namespace ms::cuda
