#include "util/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "util/error.h"

namespace ms {

ResidentMemory::ResidentMemory(size_t bytes, const char* what, bool populate) : bytes_(bytes) {
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("cannot allocate {} of {} bytes: {}", what, bytes, std::strerror(errno));
  data_ = static_cast<uint8_t*>(p);
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: where THP is off this changes nothing
#endif
  if (!populate) return;
#ifdef MADV_POPULATE_WRITE
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
  if (errno == ENOMEM) {
    munmap(p, bytes);
    data_ = nullptr;
    fail("cannot fault in {} of {} bytes: out of memory (a memory cap below it?)", what, bytes);
  }
#endif
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < bytes; i += page) data_[i] = 0;  // older kernels: touch every page
}

ResidentMemory::~ResidentMemory() {
  if (data_) munmap(data_, bytes_);
}

ResidentMemory::ResidentMemory(ResidentMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

ResidentMemory& ResidentMemory::operator=(ResidentMemory&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, bytes_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace ms
