#include "quant/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "quant/affine.h"
#include "util/error.h"
#include "util/half.h"

namespace ms {

namespace {

constexpr float kHalfMax = 65504.f;

size_t code_bytes(KvSide s, int hd) { return size_t(hd) * size_t(s.bits) / 8; }

float to_half_float(float x) { return f16_to_f32(f32_to_f16(std::clamp(x, -kHalfMax, kHalfMax))); }

// splitmix64: a small, fixed generator, so that a seed gives the same rotation everywhere.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
  double normal() {  // Box-Muller, its two draws in order
    const double u = uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
  }
};

struct Quaternion {
  double w, x, y, z;
};

Quaternion random_unit_quaternion(SplitMix& rng) {
  Quaternion q{rng.normal(), rng.normal(), rng.normal(), rng.normal()};
  const double n = std::sqrt(q.w * q.w + q.x * q.x + q.y * q.y + q.z * q.z);
  return {q.w / n, q.x / n, q.y / n, q.z / n};
}

// R = L(a)·R(b): p ↦ a·p·b for quaternions p (w, x, y, z), row-major into m[16].
void so4_block(const Quaternion& a, const Quaternion& b, float* m) {
  const double L[4][4] = {{a.w, -a.x, -a.y, -a.z}, {a.x, a.w, -a.z, a.y}, {a.y, a.z, a.w, -a.x}, {a.z, -a.y, a.x, a.w}};
  const double R[4][4] = {{b.w, -b.x, -b.y, -b.z}, {b.x, b.w, b.z, -b.y}, {b.y, -b.z, b.w, b.x}, {b.z, b.y, -b.x, b.w}};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += L[i][k] * R[k][j];
      m[i * 4 + j] = float(s);
    }
}

}  // namespace

size_t KvSide::row_bytes(int hd) const {
  if (bits == 32) return size_t(hd) * 4;
  if (bits == 16) return size_t(hd) * 2;
  return code_bytes(*this, hd) + 2 * sizeof(uint16_t) * size_t(hd / group);
}

void check_kv_side(KvSide s, int hd, const char* what) {
  if (s.bits != 32 && s.bits != 16 && s.bits != 8 && s.bits != 4 && s.bits != 3 && s.bits != 2)
    fail("{}: KV cache bits must be 32, 16, 8, 4, 3 or 2, got {}", what, s.bits);
  if (!s.quantized()) return;
  if (s.group != 32 && s.group != 64 && s.group != 128)
    fail("{}: KV cache group must be 32, 64 or 128, got {}", what, s.group);
  if (hd % s.group != 0) fail("{}: KV cache group {} does not divide head_dim {}", what, s.group, hd);
}

void kv_encode(KvSide s, const float* x, int hd, uint8_t* row) {
  if (s.bits == 32) {
    std::memcpy(row, x, size_t(hd) * 4);
    return;
  }
  if (s.bits == 16) {
    for (int i = 0; i < hd; ++i) {
      const bf16 b = f32_to_bf16(x[i]);
      std::memcpy(row + 2 * size_t(i), &b, 2);
    }
    return;
  }
  const int groups = hd / s.group, qmax = (1 << s.bits) - 1;
  uint8_t codes[256 * 2];
  std::vector<uint8_t> big;
  uint8_t* q = codes;
  if (hd > int(sizeof codes)) q = (big.resize(size_t(hd)), big.data());
  uint8_t* params = row + code_bytes(s, hd);
  for (int g = 0; g < groups; ++g) {
    const float* gx = x + size_t(g) * size_t(s.group);
    const auto [lo, hi] = std::minmax_element(gx, gx + s.group);
    const float bias = to_half_float(*lo), scale = to_half_float((*hi - bias) / float(qmax));
    for (int i = 0; i < s.group; ++i) {
      const float level = scale > 0.f ? std::nearbyint((gx[i] - bias) / scale) : 0.f;
      q[size_t(g) * size_t(s.group) + size_t(i)] = uint8_t(std::clamp(level, 0.f, float(qmax)));
    }
    const f16 hs = f32_to_f16(scale), hb = f32_to_f16(bias);
    std::memcpy(params + 2 * size_t(g), &hs, 2);
    std::memcpy(params + 2 * size_t(groups + g), &hb, 2);
  }
  pack_bits(q, size_t(hd), s.bits, row);
}

void kv_decode(KvSide s, const uint8_t* row, int hd, float* out) {
  if (s.bits == 32) {
    std::memcpy(out, row, size_t(hd) * 4);
    return;
  }
  if (s.bits == 16) {
    for (int i = 0; i < hd; ++i) {
      bf16 b;
      std::memcpy(&b, row + 2 * size_t(i), 2);
      out[i] = bf16_to_f32(b);
    }
    return;
  }
  const int groups = hd / s.group;
  std::vector<uint8_t> q(static_cast<size_t>(hd));
  unpack_bits(row, 0, size_t(hd), s.bits, q.data());
  const uint8_t* params = row + code_bytes(s, hd);
  for (int g = 0; g < groups; ++g) {
    f16 hs, hb;
    std::memcpy(&hs, params + 2 * size_t(g), 2);
    std::memcpy(&hb, params + 2 * size_t(groups + g), 2);
    const float scale = f16_to_f32(hs), bias = f16_to_f32(hb);
    for (int i = 0; i < s.group; ++i) {
      const size_t c = size_t(g) * size_t(s.group) + size_t(i);
      out[c] = scale * float(q[c]) + bias;
    }
  }
}

const char* kv_rotation_name(KvRotation r) {
  switch (r) {
    case KvRotation::None: return "none";
    case KvRotation::So4: return "so4";
    case KvRotation::Hadamard: return "hadamard";
  }
  return "?";
}

namespace {

// Throws naming the flag unless `kind` can rotate heads of hd.
void check_rotation(KvRotation kind, int hd) {
  if (kind == KvRotation::So4 && hd % 4 != 0) fail("--kv-rotation so4: head_dim {} is not a multiple of 4", hd);
  if (kind == KvRotation::Hadamard && (hd <= 0 || (hd & (hd - 1)) != 0))
    fail("--kv-rotation hadamard: head_dim {} is not a power of two (--kv-rotation so4 needs a multiple of 4)", hd);
}

}  // namespace

void check_kv_format(const KvFormat& f, int hd) {
  check_kv_side(f.k, hd, "--kv-bits (keys)");
  check_kv_side(f.v, hd, "--kv-bits (values)");
  if (f.rotates(f.k) || f.rotates(f.v)) check_rotation(f.rotation, hd);
}

KvRotator::KvRotator(KvRotation kind, int hd, uint64_t seed) : kind_(kind), hd_(hd) {
  check_rotation(kind, hd);
  SplitMix rng{seed};
  if (kind == KvRotation::So4) {
    blocks_.resize(size_t(hd) * 4);
    for (int b = 0; b < hd / 4; ++b) {
      const Quaternion qa = random_unit_quaternion(rng), qb = random_unit_quaternion(rng);
      so4_block(qa, qb, blocks_.data() + size_t(b) * 16);
    }
  } else if (kind == KvRotation::Hadamard) {
    signs_.resize(size_t(hd));
    for (float& s : signs_) s = (rng.next() >> 63) ? -1.f : 1.f;
  }
}

void KvRotator::hadamard(float* x) const {
  for (int h = 1; h < hd_; h *= 2)
    for (int i = 0; i < hd_; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float norm = 1.f / std::sqrt(float(hd_));
  for (int i = 0; i < hd_; ++i) x[i] *= norm;
}

void KvRotator::apply(float* x, size_t rows) const { rotate(x, rows, false); }
void KvRotator::undo(float* x, size_t rows) const { rotate(x, rows, true); }

void KvRotator::rotate(float* x, size_t rows, bool inverse) const {
  for (size_t r = 0; r < rows; ++r, x += hd_) {
    if (kind_ == KvRotation::So4) {
      const int step = inverse ? 4 : 1;  // Rᵀ's row i is R's column i
      for (int b = 0; b < hd_ / 4; ++b) {
        const float* m = blocks_.data() + size_t(b) * 16;
        float* p = x + 4 * b;
        const float in[4] = {p[0], p[1], p[2], p[3]};
        for (int i = 0; i < 4; ++i) {
          const float* row = m + (inverse ? i : 4 * i);
          p[i] = row[0] * in[0] + row[step] * in[1] + row[2 * step] * in[2] + row[3 * step] * in[3];
        }
      }
    } else if (kind_ == KvRotation::Hadamard) {
      if (!inverse)
        for (int i = 0; i < hd_; ++i) x[i] *= signs_[size_t(i)];
      hadamard(x);  // H is symmetric: Rᵀ = D·H/√hd
      if (inverse)
        for (int i = 0; i < hd_; ++i) x[i] *= signs_[size_t(i)];
    }
  }
}

uint64_t KvFormat::bytes_per_position(int n_kv, int hd) const {
  return uint64_t(n_kv) * uint64_t(k.row_bytes(hd) + v.row_bytes(hd));
}

std::string KvFormat::describe() const {
  if (exact()) return "float32";
  if (k.bits == 16 && v.bits == 16) return "bf16";
  auto side = [](KvSide s) { return s.bits == 32 ? std::string("f32") : s.bits == 16 ? std::string("bf16") : std::to_string(s.bits); };
  std::string d = "K" + side(k) + "/V" + side(v);
  if (k.quantized() || v.quantized())
    d += " g" + std::to_string(k.quantized() ? k.group : v.group) + " " + kv_rotation_name(rotation);
  return d;
}

void parse_kv_bits(const std::string& text, KvFormat& f) {
  auto number = [&](const std::string& s) {
    if (s.empty() || s.size() > 2 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      fail("--kv-bits: '{}' is not K,V bits (e.g. 32,32, 16,16, 8,8, 4,3)", text);
    return std::stoi(s);
  };
  const size_t comma = text.find(',');
  f.k.bits = number(text.substr(0, comma));
  f.v.bits = comma == std::string::npos ? f.k.bits : number(text.substr(comma + 1));
  for (int b : {f.k.bits, f.v.bits})
    if (b != 32 && b != 16 && b != 8 && b != 4 && b != 3 && b != 2)
      fail("--kv-bits: {} bits in '{}' is not one of 32, 16, 8, 4, 3, 2", b, text);
}

KvRotation parse_kv_rotation(const std::string& text) {
  for (KvRotation r : {KvRotation::None, KvRotation::So4, KvRotation::Hadamard})
    if (text == kv_rotation_name(r)) return r;
  fail("--kv-rotation: '{}' is not so4, hadamard or none", text);
}

}  // namespace ms
