#pragma once
// GGUF's (ggml's) block quantizations, carried into the affine format without changing a single
// dequantized weight (docs/FORMAT.md, "Importing GGUF files"). Every block type below dequantizes
// as scale·q + bias per group with q unsigned, once its signed codes are offset and its
// sub-block scales multiplied out:
//   Q8_0  d·x           -> 8 bits, group 32, f16: scale d, bias −128d, q = x + 128
//   Q4_0  d·(q − 8)     -> 4 bits, group 32, f16: bias −8d       Q4_1  d·q + m -> f16: bias m
//   Q5_0  d·(q − 16)    -> 5 bits, group 32, f16: bias −16d      Q5_1  d·q + m -> f16: bias m
//   Q4_K  d·sc·q − dmin·m -> 4 bits, group 32, f32 (d·sc and dmin·m are exact in f32, not f16)
//   Q5_K  the same with 5 bits
//   Q6_K  d·sc·(q − 32) -> 6 bits, group 16, f32: bias −32·d·sc
// Each product is exact in float32 and scale·q + bias rounds once, as ggml's (and gguf-py's)
// float arithmetic does, so the values are the same (a zero's sign aside).
#include <cstddef>
#include <cstdint>
#include <string>

#include "quant/affine.h"

namespace ms {

// The ggml tensor types the importer knows (ggml.h's numbering); others are refused by name.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

// Values a block holds and its bytes; false for a type outside GgmlType.
bool ggml_type_info(uint32_t type, int* block_values, int* block_bytes);
std::string ggml_type_name(uint32_t type);  // "Q4_K", or "type 23" when unknown

struct GgufAffine {
  int bits = 0, group = 0;
  ScaleType scale_type = ScaleType::BF16;
};

// The affine layout of a ggml block type (GgmlType numbering); false for F32/F16/BF16 and
// types the importer does not read.
bool gguf_affine_layout(uint32_t type, GgufAffine* out);

// Whether `wide` holds every value of `narrow` exactly: at least its bits, a group dividing its
// group, and scales at least as precise (f32 holds f16). Two GGUF tensors that become one engine
// matrix (Qwen3-Next's attn_qkv and attn_gate) meet in such a layout.
bool affine_layout_holds(const GgufAffine& wide, const GgufAffine& narrow);

// One row of `cols` values (cols a multiple of the block size) from its blocks into the row's
// codes (cols·bits/8 bytes), scales and biases (cols/group entries of the scale type) of layout
// `to`, which must hold the type's own layout (affine_layout_holds). Returns false where a
// scale or bias does not fit an f16 exactly (a −128·d that overflows): the caller then
// converts the tensor with f32 scales.
bool gguf_row_to_affine(uint32_t type, const uint8_t* blocks, int cols, const GgufAffine& to, uint8_t* codes,
                        uint16_t* scales, uint16_t* biases);

}  // namespace ms
