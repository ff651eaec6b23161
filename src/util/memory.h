#pragma once
// Large, 4 KiB-aligned anonymous memory, transparent huge pages asked for. With `populate` every
// page is faulted in at allocation (MADV_POPULATE_WRITE, else a write to each page), so that the
// first read into a never-used expert slot does not pay for page faults and a cgroup charges the
// whole buffer when it is made, not in the middle of a decode; without, pages come on first use
// (memory sized by no budget, which may be larger than the machine and only partly used).
#include <cstddef>
#include <cstdint>
#include <string>

namespace ms {

// Bytes this process may still take: the machine's MemAvailable, less where the process's memory
// cgroup (v1 memory.limit_in_bytes, v2 memory.max) leaves less room.
uint64_t available_memory();

// The tightest memory limit of the cgroups this process is in: from its own cgroup up to the
// root of each hierarchy (v1's memory controller, memory.limit_in_bytes; v2's memory.max), the
// nearest limited ancestor counting. bytes 0: no cgroup limits this process. The arguments are
// for tests: /proc/self/cgroup's text and where the hierarchies are mounted.
struct CgroupLimit {
  uint64_t bytes = 0;
  std::string file;  // the limit's file, e.g. /sys/fs/cgroup/memory/job/memory.limit_in_bytes
};
CgroupLimit cgroup_memory_limit(const std::string& proc_cgroup, const std::string& sys_fs_cgroup = "/sys/fs/cgroup");
CgroupLimit cgroup_memory_limit();  // this process's

// Shares of a limit a default budget leaves for what the process does not plan (other
// processes of the cgroup, page cache, allocator slack): 5 % of a cgroup's limit, 10 % of
// MemAvailable, which other processes of the machine share.
constexpr double kCgroupMargin = 0.05, kMemAvailableMargin = 0.10;

// The host memory a process may plan for where the user names no budget: the cgroup limit
// less kCgroupMargin, or MemAvailable less kMemAvailableMargin where that is lower. `source`
// says where it came from, e.g. "the cgroup memory limit (40.0 MiB, /sys/fs/cgroup/memory/job/
// memory.limit_in_bytes) less 5 %".
struct HostBudget {
  uint64_t bytes = 0;
  CgroupLimit limit;  // bytes 0 where no cgroup limits the process
  std::string source;
};
HostBudget default_host_budget();
// Fails where `bytes`, which `flag` (e.g. "--memory") asks for, exceeds the cgroup limit: both
// numbers and the limit's file in the message.
void check_under_cgroup_limit(uint64_t bytes, const char* flag);
// "1.50 GiB" / "38.0 MiB".
std::string format_bytes(uint64_t bytes);

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
