#include "util/memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

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

// The path of this process's cgroup for `controller` ("memory" in v1, "" for the v2 hierarchy)
// in the text of /proc/self/cgroup.
std::string own_cgroup_in(const std::string& text, const std::string& controller) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string names = line.substr(a + 1, b - a - 1);
    if (controller.empty() ? names.empty() : ("," + names + ",").find("," + controller + ",") != std::string::npos)
      return line.substr(b + 1);
  }
  return "";
}

std::string proc_self_cgroup() {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string own_cgroup(const std::string& controller) { return own_cgroup_in(proc_self_cgroup(), controller); }

// v1 writes "no limit" as the largest page count in bytes (0x7ffffffffffff000); v2 as "max".
constexpr uint64_t kUnlimited = uint64_t(1) << 62;

// The tightest limit in `file_name` from `root`/`cgroup` up to `root`.
void tightest_on_path(const std::filesystem::path& root, const std::string& cgroup, const char* file_name, CgroupLimit& best) {
  std::filesystem::path p = std::filesystem::path(cgroup).relative_path();
  for (;;) {
    const std::filesystem::path file = root / p / file_name;
    const uint64_t v = read_number(file.string(), UINT64_MAX);
    if (v < kUnlimited && (best.bytes == 0 || v < best.bytes)) best = {v, file.lexically_normal().string()};
    if (p.empty()) return;
    p = p.parent_path();
  }
}

uint64_t mem_available() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    meminfo >> kib;
    meminfo.ignore(64, '\n');
    if (key == "MemAvailable:") return kib * 1024;
  }
  return UINT64_MAX;
}

}  // namespace

uint64_t available_memory() {
  constexpr uint64_t kNone = UINT64_MAX;
  uint64_t avail = mem_available();
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

CgroupLimit cgroup_memory_limit(const std::string& proc_cgroup, const std::string& sys_fs_cgroup) {
  CgroupLimit best;
  const std::filesystem::path root(sys_fs_cgroup);
  if (const std::string v1 = own_cgroup_in(proc_cgroup, "memory"); !v1.empty())
    tightest_on_path(root / "memory", v1, "memory.limit_in_bytes", best);
  // v2: the whole of /sys/fs/cgroup, or /sys/fs/cgroup/unified beside v1's controllers (hybrid).
  const std::filesystem::path v2_root = std::filesystem::exists(root / "cgroup.controllers") ? root : root / "unified";
  if (const std::string v2 = own_cgroup_in(proc_cgroup, ""); !v2.empty()) tightest_on_path(v2_root, v2, "memory.max", best);
  return best;
}

CgroupLimit cgroup_memory_limit() { return cgroup_memory_limit(proc_self_cgroup()); }

std::string format_bytes(uint64_t b) {
  return b >= (uint64_t(1) << 30) ? fmt::format("{:.2f} GiB", double(b) / double(uint64_t(1) << 30))
                                  : fmt::format("{:.1f} MiB", double(b) / double(uint64_t(1) << 20));
}

HostBudget default_host_budget() {
  HostBudget b;
  b.limit = cgroup_memory_limit();
  const uint64_t avail = mem_available();
  const uint64_t from_avail = avail == UINT64_MAX ? UINT64_MAX : uint64_t(double(avail) * (1 - kMemAvailableMargin));
  if (b.limit.bytes) {
    b.bytes = uint64_t(double(b.limit.bytes) * (1 - kCgroupMargin));
    b.source = fmt::format("the cgroup memory limit ({}, {}) less {:.0f} %", format_bytes(b.limit.bytes), b.limit.file,
                           kCgroupMargin * 100);
  }
  if (!b.limit.bytes || from_avail < b.bytes) {
    b.bytes = from_avail;
    b.source = fmt::format("MemAvailable ({}) less {:.0f} %", format_bytes(avail), kMemAvailableMargin * 100);
  }
  return b;
}

void check_under_cgroup_limit(uint64_t bytes, const char* flag) {
  const CgroupLimit l = cgroup_memory_limit();
  if (l.bytes && bytes > l.bytes)
    fail("{} {} is more than this process's cgroup memory limit of {} ({}): the kernel would kill it; ask for less", flag,
         format_bytes(bytes), format_bytes(l.bytes), l.file);
}

}  // namespace ms
