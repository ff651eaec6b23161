#pragma once
// A reference under one decode matvec's time (bench_cuda_matvec): the simplest kernel that
// streams the same bytes from HBM, launched as the matvecs are (overlapped with the kernel before,
// reading only once that kernel is done, as a kernel reading its output must).
#include <cstddef>
#include <cstdint>

namespace ms::bench {
// Reads bytes [p, p + bytes) (p 16-byte aligned, bytes a multiple of 16) with all of the GPU's
// threads; out (one word) is written only for a sum no input here gives, so no load is dropped.
void stream_read(const void* p, size_t bytes, uint32_t* out);
}  // namespace ms::bench
