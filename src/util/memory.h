#pragma once
// Large, 4 KiB-aligned anonymous memory, transparent huge pages asked for. With `populate` every
// page is faulted in at allocation (MADV_POPULATE_WRITE, else a write to each page), so that the
// first read into a never-used expert slot does not pay for page faults and a cgroup charges the
// whole buffer when it is made, not in the middle of a decode; without, pages come on first use
// (memory sized by no budget, which may be larger than the machine and only partly used).
#include <cstddef>
#include <cstdint>

namespace ms {

// Bytes this process may still take: the machine's MemAvailable, less where the process's memory
// cgroup (v1 memory.limit_in_bytes, v2 memory.max) leaves less room.
uint64_t available_memory();

class ResidentMemory {
 public:
  ResidentMemory() = default;
  // Fails naming `what` where the memory cannot be had.
  ResidentMemory(size_t bytes, const char* what, bool populate = true);
  ~ResidentMemory();
  ResidentMemory(ResidentMemory&& o) noexcept;
  ResidentMemory& operator=(ResidentMemory&& o) noexcept;
  ResidentMemory(const ResidentMemory&) = delete;
  ResidentMemory& operator=(const ResidentMemory&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ms
