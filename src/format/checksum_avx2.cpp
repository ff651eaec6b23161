// XXH3-64 compiled for AVX2 (xxhash's own AVX2 loop), for checksum.cpp to call where the CPU has
// it. Only this file's functions get the target: nothing here is shared with other files (the
// xxhash functions are inlined and file-local), so no AVX2 code can run on a CPU without it.
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#include <immintrin.h>
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace ms {

uint64_t xxh3_64_avx2(const void* data, size_t n) { return XXH3_64bits(data, n); }

}  // namespace ms

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
namespace ms {
uint64_t xxh3_64_avx2(const void*, size_t) { return 0; }  // never called: checksum.cpp checks the CPU
}  // namespace ms
#endif
