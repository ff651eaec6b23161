#pragma once
// Affine group quantization (DESIGN.md, Formats → Affine quantization): per group of `group`
// consecutive input weights of a row, w ≈ scale·q + bias, q an unsigned `bits`-bit integer,
// scale and bias per group, bf16 unless an import needs more (ScaleType). A row's q values are
// one little-endian bit stream, value i in bits [i·bits, (i+1)·bits): exactly MLX's packing
// for every width (for 3 and 5 bits eight values per three and five bytes, for 6 bits four per
// three).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "util/half.h"

namespace ms {

// The precision of a matrix's scales and biases: bf16 (what quantize() writes, and MLX's), or
// f16 / f32 where an imported GGUF block format needs it to stay exact (docs/FORMAT.md).
enum class ScaleType : uint8_t { BF16, F16, F32 };

size_t scale_size(ScaleType t);           // bytes of one scale: 2, 2, 4
const char* scale_type_name(ScaleType t);  // "bf16", "f16", "f32"
bool parse_scale_type(const std::string& s, ScaleType* out);

// Entry i of a scales or biases array of type t, as float (exact: every type widens).
inline float scale_value(const uint16_t* p, size_t i, ScaleType t) {
  switch (t) {
    case ScaleType::F16: return f16_to_f32(p[i]);
    case ScaleType::F32: {
      float f;
      std::memcpy(&f, p + 2 * i, 4);
      return f;
    }
    default: return bf16_to_f32(p[i]);
  }
}

// The array of type t starting at entry i of p (f32 entries are two words).
inline const uint16_t* scale_entry(const uint16_t* p, size_t i, ScaleType t) { return p + i * (scale_size(t) / 2); }

// A quantized [rows, cols] matrix (rows = outputs, cols = inputs), borrowed.
struct QuantMat {
  const uint8_t* q = nullptr;         // rows × row_bytes(), row-major bit streams
  const uint16_t* scales = nullptr;   // [rows, cols/group] of scale_type (f32: two words each)
  const uint16_t* biases = nullptr;   // [rows, cols/group] of scale_type
  int rows = 0, cols = 0, bits = 0, group = 0;
  ScaleType scale_type = ScaleType::BF16;

  size_t row_bytes() const { return size_t(cols) * size_t(bits) / 8; }
  int groups_per_row() const { return cols / group; }
  float scale(size_t i) const { return scale_value(scales, i, scale_type); }
  float bias(size_t i) const { return scale_value(biases, i, scale_type); }
};

// The owning form, as quantize() produces it.
struct QuantBuffer {
  std::vector<uint8_t> q;
  std::vector<uint16_t> scales, biases;
  int rows = 0, cols = 0, bits = 0, group = 0;

  QuantMat view() const { return {q.data(), scales.data(), biases.data(), rows, cols, bits, group}; }
};

// Throws naming `what` unless bits ∈ {2,3,4,5,6,8}, group ∈ {32,64,128} (or 16 with at least
// 4 bits: GGUF's Q6_K), rows ≥ 0 and cols a positive multiple of group.
void check_quant_shape(int rows, int cols, int bits, int group, const char* what);

// Packs n values (each < 2^bits) into ceil(n·bits/8) bytes; unused high bits of the last byte
// are zero.
void pack_bits(const uint8_t* values, size_t n, int bits, uint8_t* out);

// Reads n values starting at value index `first` of a packed stream.
void unpack_bits(const uint8_t* stream, size_t first, size_t n, int bits, uint8_t* values);

// Quantizes w [rows, cols] row-major. Bias is bf16(min) rounded down and scale bf16 rounded up,
// so every weight of a group lies in [bias, bias + scale·(2^bits − 1)] and
// |w − deq(w)| ≤ scale/2 up to float rounding of scale·q + bias.
QuantBuffer quantize(const float* w, int rows, int cols, int bits, int group);

// out[cols] = scale·q + bias for one row (float arithmetic, what the kernels compute).
void dequantize_row(const QuantMat& m, int row, float* out);

}  // namespace ms
