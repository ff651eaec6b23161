#pragma once
// A weight matrix as the kernels see it: [rows = outputs, cols = inputs], row-major, in the
// dtype it is stored in. The data is borrowed (mmap'ed checkpoint, expert slot, or owned buffer).
#include <cstdint>

namespace ms {

enum class WeightType { F32, BF16 };

struct Mat {
  WeightType type = WeightType::F32;
  const void* data = nullptr;
  int rows = 0;
  int cols = 0;
};

}  // namespace ms
