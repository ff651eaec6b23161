#pragma once
// Affine group quantization (DESIGN.md, Formats → Affine quantization): per group of `group`
// consecutive input weights of a row, w ≈ scale·q + bias, q an unsigned `bits`-bit integer,
// scale and bias bf16 per group. A row's q values are one little-endian bit stream, value i in
// bits [i·bits, (i+1)·bits): for 2/4/8 bits exactly MLX's uint32 packing, for 3 bits eight
// values per three bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ms {

// A quantized [rows, cols] matrix (rows = outputs, cols = inputs), borrowed.
struct QuantMat {
  const uint8_t* q = nullptr;         // rows × row_bytes(), row-major bit streams
  const uint16_t* scales = nullptr;   // [rows, cols/group] bf16 bits
  const uint16_t* biases = nullptr;   // [rows, cols/group] bf16 bits
  int rows = 0, cols = 0, bits = 0, group = 0;

  size_t row_bytes() const { return size_t(cols) * size_t(bits) / 8; }
  int groups_per_row() const { return cols / group; }
};

// The owning form, as quantize() produces it.
struct QuantBuffer {
  std::vector<uint8_t> q;
  std::vector<uint16_t> scales, biases;
  int rows = 0, cols = 0, bits = 0, group = 0;

  QuantMat view() const { return {q.data(), scales.data(), biases.data(), rows, cols, bits, group}; }
};

// Throws naming `what` unless bits ∈ {2,3,4,8}, group ∈ {32,64,128}, rows ≥ 0 and cols a
// positive multiple of group.
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
