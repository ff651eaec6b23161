#include "quant/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace ms {

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// bf16 rounding toward −∞ and +∞: the directed roundings that keep every weight of a group
// inside the range the stored (bias, scale) pair can represent.
bf16 bf16_round_down(float f) {
  uint32_t u = float_bits(f);
  bool inexact = (u & 0xffffu) != 0;
  if (std::signbit(f) && inexact) u += 0x10000u;  // grows the magnitude of a negative value
  return bf16(u >> 16);
}

bf16 bf16_round_up(double d) {  // d ≥ 0
  float f = float(d);
  if (double(f) < d) f = std::nextafter(f, INFINITY);
  uint32_t u = float_bits(f);
  if (u & 0xffffu) u += 0x10000u;
  return bf16(u >> 16);
}

struct GroupParams {
  bf16 scale, bias;
};

GroupParams choose_params(const float* w, int n, int qmax) {
  auto [lo, hi] = std::minmax_element(w, w + n);
  bf16 bias = bf16_round_down(*lo);
  double need = (double(*hi) - double(bf16_to_f32(bias))) / qmax;
  bf16 scale = bf16_round_up(need);
  if (!std::isfinite(bf16_to_f32(bias)) || !std::isfinite(bf16_to_f32(scale)))
    fail("quantize: weight range [{}, {}] overflows bf16 scale/bias", *lo, *hi);
  return {scale, bias};
}

}  // namespace

size_t scale_size(ScaleType t) { return t == ScaleType::F32 ? 4 : 2; }

const char* scale_type_name(ScaleType t) {
  switch (t) {
    case ScaleType::F16: return "f16";
    case ScaleType::F32: return "f32";
    default: return "bf16";
  }
}

bool parse_scale_type(const std::string& s, ScaleType* out) {
  for (ScaleType t : {ScaleType::BF16, ScaleType::F16, ScaleType::F32})
    if (s == scale_type_name(t)) return *out = t, true;
  return false;
}

void check_quant_shape(int rows, int cols, int bits, int group, const char* what) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
    fail("{}: quantization bits must be 2, 3, 4, 5, 6 or 8, got {}", what, bits);
  if (group != 32 && group != 64 && group != 128 && !(group == 16 && bits >= 4))
    fail("{}: quantization group must be 32, 64 or 128 (or 16 with 4 or more bits), got {}", what, group);
  if (rows < 0 || cols <= 0 || cols % group != 0)
    fail("{}: shape [{}, {}] needs rows ≥ 0 and cols a positive multiple of the group size {}", what,
         rows, cols, group);
}

void pack_bits(const uint8_t* values, size_t n, int bits, uint8_t* out) {
  uint32_t acc = 0;  // pending bits, lowest first; never more than 7 + 8 of them
  int pending = 0;
  for (size_t i = 0; i < n; ++i) {
    if (values[i] >> bits) fail("pack_bits: value {} at index {} does not fit in {} bits", values[i], i, bits);
    acc |= uint32_t(values[i]) << pending;
    pending += bits;
    for (; pending >= 8; pending -= 8, acc >>= 8) *out++ = uint8_t(acc);
  }
  if (pending > 0) *out = uint8_t(acc);
}

void unpack_bits(const uint8_t* stream, size_t first, size_t n, int bits, uint8_t* values) {
  const uint32_t mask = (1u << bits) - 1;
  for (size_t i = 0; i < n; ++i) {
    size_t pos = (first + i) * size_t(bits);
    size_t byte = pos / 8;
    int shift = int(pos % 8);
    uint32_t word = stream[byte];
    if (shift + bits > 8) word |= uint32_t(stream[byte + 1]) << 8;  // only when the value straddles
    values[i] = uint8_t((word >> shift) & mask);
  }
}

QuantBuffer quantize(const float* w, int rows, int cols, int bits, int group) {
  check_quant_shape(rows, cols, bits, group, "quantize");
  QuantBuffer out;
  out.rows = rows, out.cols = cols, out.bits = bits, out.group = group;
  const QuantMat shape = out.view();
  const int groups = shape.groups_per_row();
  const int qmax = (1 << bits) - 1;
  out.q.resize(size_t(rows) * shape.row_bytes());
  out.scales.resize(size_t(rows) * size_t(groups));
  out.biases.resize(out.scales.size());

  std::vector<uint8_t> q(static_cast<size_t>(cols));
  for (int r = 0; r < rows; ++r) {
    const float* row = w + size_t(r) * size_t(cols);
    for (int c = 0; c < cols; ++c)
      if (!std::isfinite(row[c])) fail("quantize: weight [{}, {}] is not finite ({})", r, c, row[c]);
    for (int g = 0; g < groups; ++g) {
      const float* gw = row + size_t(g) * size_t(group);
      GroupParams p = choose_params(gw, group, qmax);
      double scale = bf16_to_f32(p.scale), bias = bf16_to_f32(p.bias);
      for (int i = 0; i < group; ++i) {
        double level = scale > 0 ? std::nearbyint((double(gw[i]) - bias) / scale) : 0.0;
        q[size_t(g) * size_t(group) + size_t(i)] = uint8_t(std::clamp(level, 0.0, double(qmax)));
      }
      out.scales[size_t(r) * size_t(groups) + size_t(g)] = p.scale;
      out.biases[size_t(r) * size_t(groups) + size_t(g)] = p.bias;
    }
    pack_bits(q.data(), size_t(cols), bits, out.q.data() + size_t(r) * shape.row_bytes());
  }
  return out;
}

void dequantize_row(const QuantMat& m, int row, float* out) {
  check_quant_shape(m.rows, m.cols, m.bits, m.group, "dequantize_row");
  if (row < 0 || row >= m.rows) fail("dequantize_row: row {} outside [0, {})", row, m.rows);
  std::vector<uint8_t> q(static_cast<size_t>(m.cols));
  unpack_bits(m.q + size_t(row) * m.row_bytes(), 0, size_t(m.cols), m.bits, q.data());
  const int groups = m.groups_per_row();
  for (int g = 0; g < groups; ++g) {
    const float scale = m.scale(size_t(row) * size_t(groups) + size_t(g));
    const float bias = m.bias(size_t(row) * size_t(groups) + size_t(g));
    for (int i = 0; i < m.group; ++i) {
      size_t c = size_t(g) * size_t(m.group) + size_t(i);
      out[c] = scale * float(q[c]) + bias;
    }
  }
}

}  // namespace ms
