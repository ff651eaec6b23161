#pragma once
// The machine's memory bandwidth as the best kernels can use it, the bound the decode
// benchmarks report against: every thread of the global pool reads its share of a buffer far
// larger than the caches with the widest vectors the CPU has, at the best of a few software
// prefetch distances; beside it a STREAM-like copy.
#include <cstddef>

namespace ms::cpu {

struct Bandwidth {
  double read_gbs = 0;  // the best read rate
  int prefetch = 0;     // the prefetch distance (bytes ahead; 0: none) that gave it
  double copy_gbs = 0;  // memcpy over the same threads, counting read + write as STREAM does
  int threads = 0;
};

// Medians of `runs` passes over `bytes` (rounded down to whole 16 MiB blocks).
Bandwidth measure_bandwidth(size_t bytes = size_t(1) << 30, int runs = 5);

}  // namespace ms::cpu
