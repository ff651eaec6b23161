#include "quant/gguf_blocks.h"

#include <cstring>
#include <vector>

#include "util/half.h"

namespace ms {

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// A block's values as codes with one (scale, bias) per group.
struct Block {
  uint8_t q[256];
  float scale[16], bias[16];
};

// Q4_0/Q4_1/Q5_0/Q5_1: element j < 16 is the low nibble of qs[j], element j + 16 the high one;
// Q5's fifth bit of element i is bit i of qh.
void nibbles32(const uint8_t* qs, const uint8_t* qh, Block& b) {
  uint32_t high = 0;
  if (qh) std::memcpy(&high, qh, 4);
  for (int j = 0; j < 16; ++j) {
    b.q[j] = uint8_t((qs[j] & 15) | (((high >> j) & 1) << 4));
    b.q[j + 16] = uint8_t((qs[j] >> 4) | (((high >> (j + 16)) & 1) << 4));
  }
}

// Q4_K/Q5_K's twelve bytes of 6-bit sub-block scales and mins.
void scale_min_k4(const uint8_t* s, int g, int* sc, int* m) {
  if (g < 4) {
    *sc = s[g] & 63;
    *m = s[g + 4] & 63;
  } else {
    *sc = (s[g + 4] & 15) | ((s[g - 4] >> 6) << 4);
    *m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}

// Decodes one block; returns its values and groups.
void decode_block(uint32_t type, const uint8_t* p, Block& b) {
  switch (GgmlType(type)) {
    case GgmlType::Q8_0: {
      const float d = f16_at(p);
      for (int j = 0; j < 32; ++j) b.q[j] = uint8_t(int(int8_t(p[2 + j])) + 128);
      b.scale[0] = d, b.bias[0] = -128.0f * d;
      return;
    }
    case GgmlType::Q4_0:
    case GgmlType::Q5_0: {
      const float d = f16_at(p);
      const bool five = GgmlType(type) == GgmlType::Q5_0;
      nibbles32(p + (five ? 6 : 2), five ? p + 2 : nullptr, b);
      b.scale[0] = d, b.bias[0] = (five ? -16.0f : -8.0f) * d;
      return;
    }
    case GgmlType::Q4_1:
    case GgmlType::Q5_1: {
      const bool five = GgmlType(type) == GgmlType::Q5_1;
      nibbles32(p + (five ? 8 : 4), five ? p + 4 : nullptr, b);
      b.scale[0] = f16_at(p), b.bias[0] = f16_at(p + 2);
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const float d = f16_at(p), dmin = f16_at(p + 2);
      const uint8_t* sc = p + 4;
      const bool five = GgmlType(type) == GgmlType::Q5_K;
      const uint8_t* qh = p + 16;
      const uint8_t* qs = p + (five ? 48 : 16);
      for (int g = 0; g < 8; ++g) {
        int s, m;
        scale_min_k4(sc, g, &s, &m);
        b.scale[g] = d * float(s), b.bias[g] = -(dmin * float(m));
        const uint8_t* src = qs + 32 * (g / 2);
        for (int j = 0; j < 32; ++j) {
          const int low = g % 2 ? src[j] >> 4 : src[j] & 15;
          const int high = five ? ((qh[j] >> g) & 1) << 4 : 0;
          b.q[32 * g + j] = uint8_t(low | high);
        }
      }
      return;
    }
    case GgmlType::Q6_K: {
      const uint8_t *ql = p, *qh = p + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
      const float d = f16_at(p + 208);
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, r = e % 128;
        const int low = r < 64 ? ql[64 * h + r] & 15 : ql[64 * h + r - 64] >> 4;
        const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        b.q[e] = uint8_t(low | (high << 4));
      }
      for (int g = 0; g < 16; ++g) b.scale[g] = d * float(sc[g]), b.bias[g] = -32.0f * b.scale[g];
      return;
    }
    default: return;  // float types have no blocks; callers check gguf_affine_layout first
  }
}

// v as `t`, where exact; false otherwise.
bool put_scale(float v, ScaleType t, uint16_t* out, size_t i) {
  switch (t) {
    case ScaleType::F32: std::memcpy(out + 2 * i, &v, 4); return true;
    case ScaleType::F16: out[i] = f32_to_f16(v); return f16_to_f32(out[i]) == v;
    default: out[i] = f32_to_bf16(v); return bf16_to_f32(out[i]) == v;
  }
}

}  // namespace

bool ggml_type_info(uint32_t type, int* block_values, int* block_bytes) {
  struct Info {
    GgmlType t;
    int values, bytes;
  };
  static constexpr Info kInfo[] = {{GgmlType::F32, 1, 4},     {GgmlType::F16, 1, 2},       {GgmlType::BF16, 1, 2},
                                   {GgmlType::Q4_0, 32, 18},  {GgmlType::Q4_1, 32, 20},    {GgmlType::Q5_0, 32, 22},
                                   {GgmlType::Q5_1, 32, 24},  {GgmlType::Q8_0, 32, 34},    {GgmlType::Q4_K, 256, 144},
                                   {GgmlType::Q5_K, 256, 176}, {GgmlType::Q6_K, 256, 210}};
  for (const Info& i : kInfo)
    if (uint32_t(i.t) == type) return *block_values = i.values, *block_bytes = i.bytes, true;
  return false;
}

std::string ggml_type_name(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::BF16: return "BF16";
    case GgmlType::Q4_0: return "Q4_0";
    case GgmlType::Q4_1: return "Q4_1";
    case GgmlType::Q5_0: return "Q5_0";
    case GgmlType::Q5_1: return "Q5_1";
    case GgmlType::Q8_0: return "Q8_0";
    case GgmlType::Q4_K: return "Q4_K";
    case GgmlType::Q5_K: return "Q5_K";
    case GgmlType::Q6_K: return "Q6_K";
  }
  return "type " + std::to_string(type);
}

bool gguf_affine_layout(uint32_t type, GgufAffine* out) {
  switch (GgmlType(type)) {
    case GgmlType::Q8_0: *out = {8, 32, ScaleType::F16}; return true;
    case GgmlType::Q4_0:
    case GgmlType::Q4_1: *out = {4, 32, ScaleType::F16}; return true;
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: *out = {5, 32, ScaleType::F16}; return true;
    case GgmlType::Q4_K: *out = {4, 32, ScaleType::F32}; return true;
    case GgmlType::Q5_K: *out = {5, 32, ScaleType::F32}; return true;
    case GgmlType::Q6_K: *out = {6, 16, ScaleType::F32}; return true;
    default: return false;
  }
}

bool affine_layout_holds(const GgufAffine& wide, const GgufAffine& narrow) {
  return wide.bits >= narrow.bits && narrow.group % wide.group == 0 &&
         (wide.scale_type == narrow.scale_type || wide.scale_type == ScaleType::F32);
}

bool gguf_row_to_affine(uint32_t type, const uint8_t* blocks, int cols, const GgufAffine& to, uint8_t* codes,
                        uint16_t* scales, uint16_t* biases) {
  GgufAffine own;
  if (!gguf_affine_layout(type, &own) || !affine_layout_holds(to, own)) return false;
  int block_values = 0, block_bytes = 0;
  ggml_type_info(type, &block_values, &block_bytes);
  const int groups = block_values / to.group, split = own.group / to.group;  // a group of `own` is `split` of `to`
  thread_local std::vector<uint8_t> q;  // a row's codes before packing; called once a row, so kept
  q.resize(size_t(cols));
  Block b;
  bool exact = true;
  for (int k = 0; k < cols / block_values; ++k) {
    decode_block(type, blocks + size_t(k) * size_t(block_bytes), b);
    std::memcpy(q.data() + size_t(k) * size_t(block_values), b.q, size_t(block_values));
    for (int g = 0; g < groups; ++g) {
      const size_t i = size_t(k) * size_t(groups) + size_t(g);
      exact &= put_scale(b.scale[g / split], to.scale_type, scales, i);
      exact &= put_scale(b.bias[g / split], to.scale_type, biases, i);
    }
  }
  pack_bits(q.data(), size_t(cols), to.bits, codes);
  return exact;
}

}  // namespace ms
