#include "util/memory.h"

#include <algorithm>
#include <fstream>
#include <string>

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

namespace {

// The first number in `path`, or `none` where it cannot be read (or says "max").
uint64_t read_number(const std::string& path, uint64_t none) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return none;
  try {
    return std::stoull(word);
  } catch (const std::exception&) {
    return none;
  }
}

// The path of this process's cgroup for `controller` ("memory" in v1, "" for the v2 hierarchy).
std::string own_cgroup(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string names = line.substr(a + 1, b - a - 1);
    if (controller.empty() ? names.empty() : ("," + names + ",").find("," + controller + ",") != std::string::npos)
      return line.substr(b + 1);
  }
  return "";
}

}  // namespace

uint64_t available_memory() {
  constexpr uint64_t kNone = UINT64_MAX;
  uint64_t avail = kNone;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    meminfo >> kib;
    meminfo.ignore(64, '\n');
    if (key == "MemAvailable:") avail = kib * 1024;
  }
  // The cgroup's room: its limit less what it holds (page cache included, which it can reclaim,
  // so this errs on the safe side).
  auto room = [&](const std::string& limit, const std::string& usage) {
    const uint64_t l = read_number(limit, kNone), u = read_number(usage, 0);
    if (l != kNone) avail = std::min(avail, l > u ? l - u : 0);
  };
  if (const std::string v1 = own_cgroup("memory"); !v1.empty())
    room("/sys/fs/cgroup/memory" + v1 + "/memory.limit_in_bytes", "/sys/fs/cgroup/memory" + v1 + "/memory.usage_in_bytes");
  if (const std::string v2 = own_cgroup(""); !v2.empty())
    room("/sys/fs/cgroup" + v2 + "/memory.max", "/sys/fs/cgroup" + v2 + "/memory.current");
  return avail;
}

}  // namespace ms
