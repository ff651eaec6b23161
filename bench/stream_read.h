#pragma once
// The references the CUDA benchmarks measure against: the device-to-device copy rate, and the
// simplest kernel that streams a matvec's bytes from HBM, launched as the matvecs are (overlapped
// with the kernel before, reading only once that kernel is done, as a kernel reading its output
// must), a floor under one decode matvec's time.
#include <cstddef>
#include <cstdint>
#include <functional>

namespace ms::bench {
// Milliseconds of the GPU work fn() queues on the compute stream: the median of 5 timed runs after
// a warm-up.
double median_ms(const std::function<void()>& fn);
// GB/s of a 2 GiB device-to-device copy on the compute stream, counting bytes read and written:
// the median of 5 after a warm-up.
double copy_gbps();
// Reads bytes [p, p + bytes) (p 16-byte aligned, bytes a multiple of 16) with all of the GPU's
// threads; out (one word) is written only for a sum no input here gives, so no load is dropped.
void stream_read(const void* p, size_t bytes, uint32_t* out);
}  // namespace ms::bench
