#include "format/checksum.h"

#include <xxhash.h>

namespace ms {

uint64_t xxh3_64_avx2(const void* data, size_t n);  // checksum_avx2.cpp

uint64_t xxh3_64(const void* data, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return xxh3_64_avx2(data, n);
#endif
  return XXH3_64bits(data, n);
}

}  // namespace ms
