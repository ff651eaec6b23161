#pragma once
// The KV cache's storage formats (docs/FORMAT.md, "KV cache"): how a head's key or value row of
// head_dim values is kept, and the fixed orthogonal rotations applied before quantizing. The
// attention kernels (CPU and CUDA) read these rows directly; kv_decode is their reference.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ms {

// One side (keys or values) of a KV cache. bits 32: float32 as computed (the exact default);
// 16: bfloat16, rounded to nearest even; 8, 4, 3, 2: affine codes per group of `group` values,
// x ≈ scale·q + bias. A quantized row is its codes (quant/affine.h's little-endian bit stream,
// hd·bits/8 bytes), then the groups' scales, then their biases, IEEE half each.
struct KvSide {
  int bits = 32;
  int group = 64;

  bool quantized() const { return bits <= 8; }
  size_t row_bytes(int hd) const;
  bool operator==(const KvSide& o) const { return bits == o.bits && group == o.group; }
};

// Throws naming `what` unless bits ∈ {32, 16, 8, 4, 3, 2} and, where quantized, group ∈
// {32, 64, 128} divides hd.
void check_kv_side(KvSide s, int hd, const char* what);

// Encodes one row of hd values: the group's bias is its minimum and its scale the range over
// 2^bits − 1, each rounded to half (saturating at ±65504), and each code the nearest level.
void kv_encode(KvSide s, const float* x, int hd, uint8_t* row);
// Decodes one row: scale·q + bias in float per value (the attention kernels' arithmetic).
void kv_decode(KvSide s, const uint8_t* row, int hd, float* out);

// A fixed orthogonal map R of a head's hd values, applied to keys (after RoPE) and values before
// they are quantized; attention then takes q rotated by the keys' R (q·k is unchanged) and
// its output rotated back by Rᵀ of the values'. It spreads an outlying dimension over its
// neighbours, so that a group's range, and its quantization error, shrink.
//  So4: each block of 4 dims by its own rotation x ↦ a·x·b (unit quaternions a, b drawn from the
//       seed), the SO(4) rotation of the system in shared/seed;
//  Hadamard: random signs from the seed, then the Walsh–Hadamard transform over all hd dims,
//       scaled by 1/√hd (hd a power of two).
enum class KvRotation { None, So4, Hadamard };
constexpr uint64_t kKvRotationSeed = 0x6b76726f74617465ull;  // "kvrotate"

const char* kv_rotation_name(KvRotation r);

class KvRotator {
 public:
  KvRotator(KvRotation kind, int hd, uint64_t seed = kKvRotationSeed);
  KvRotation kind() const { return kind_; }
  int hd() const { return hd_; }
  // x ← R·x, and x ← Rᵀ·x, for each of `rows` rows of hd values.
  void apply(float* x, size_t rows) const;
  void undo(float* x, size_t rows) const;
  // So4: [hd/4][4][4] row-major blocks of R. Hadamard: [hd] signs (±1) applied before the transform.
  const std::vector<float>& blocks() const { return blocks_; }
  const std::vector<float>& signs() const { return signs_; }

 private:
  void rotate(float* x, size_t rows, bool inverse) const;
  void hadamard(float* x) const;  // the normalised transform, in place
  KvRotation kind_;
  int hd_;
  std::vector<float> blocks_, signs_;
};

// The KV cache format of a load (--kv-bits K,V, --kv-group, --kv-rotation): the rotation applies
// to the quantized sides only.
struct KvFormat {
  KvSide k, v;
  KvRotation rotation = KvRotation::Hadamard;  // beat so4 and none on pycoder-moe (docs/kv_cache.md)
  uint64_t seed = kKvRotationSeed;

  bool exact() const { return k.bits == 32 && v.bits == 32; }
  bool rotates(KvSide s) const { return s.quantized() && rotation != KvRotation::None; }
  // Bytes one position takes in one attention layer of n_kv heads of hd.
  uint64_t bytes_per_position(int n_kv, int hd) const;
  // "float32", "bf16", "K4/V3 g64 so4", ...
  std::string describe() const;
};

// Throws naming the flag unless f suits heads of hd: each side (check_kv_side) and, where a
// quantized side is rotated, the rotation (so4: hd a multiple of 4; hadamard: a power of two).
void check_kv_format(const KvFormat& f, int hd);

// Parses --kv-bits ("32,32", "16,16", "8,8", "4,3", or one number for both) and --kv-rotation;
// throws naming the flag and the value.
void parse_kv_bits(const std::string& text, KvFormat& f);
KvRotation parse_kv_rotation(const std::string& text);

}  // namespace ms
