#pragma once
// XXH3-64 (seed 0), the checksum of format-3 expert records and dense tensors (docs/FORMAT.md):
// with AVX2 where the CPU has it, chosen at run time, else the library's build; the same value
// either way. About twice XXH64's rate on a record just read from disk (docs/PERFORMANCE.md).
#include <cstddef>
#include <cstdint>

namespace ms {

uint64_t xxh3_64(const void* data, size_t n);

}  // namespace ms
