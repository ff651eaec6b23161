// The memory a process may use (util/memory.h): the tightest cgroup limit on the path from its
// own cgroup to the root, in v1 and v2 layouts, read from a fake /sys/fs/cgroup.
#include "util/memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

void put(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

constexpr const char* kV1Unlimited = "9223372036854771712";

TEST(CgroupLimit, TheNearestLimitedAncestorOfAV1CgroupCounts) {
  const fs::path sys = test::scratch_dir("cgroup-v1");
  const std::string proc = "12:pids:/a\n4:memory:/job/step/task\n0::/\n";
  put(sys / "memory/memory.limit_in_bytes", kV1Unlimited);
  put(sys / "memory/job/memory.limit_in_bytes", "1073741824");
  put(sys / "memory/job/step/memory.limit_in_bytes", "41943040");
  put(sys / "memory/job/step/task/memory.limit_in_bytes", kV1Unlimited);
  CgroupLimit l = cgroup_memory_limit(proc, sys.string());
  EXPECT_EQ(l.bytes, 41943040u);
  EXPECT_EQ(l.file, (sys / "memory/job/step/memory.limit_in_bytes").string());
  put(sys / "memory/job/step/memory.limit_in_bytes", kV1Unlimited);
  l = cgroup_memory_limit(proc, sys.string());
  EXPECT_EQ(l.bytes, 1073741824u);  // the next limited one up
  put(sys / "memory/job/memory.limit_in_bytes", kV1Unlimited);
  EXPECT_EQ(cgroup_memory_limit(proc, sys.string()).bytes, 0u);  // none limited
}

TEST(CgroupLimit, V2ReadsMemoryMaxAndIgnoresMax) {
  const fs::path sys = test::scratch_dir("cgroup-v2");
  put(sys / "cgroup.controllers", "cpu memory pids");
  put(sys / "user.slice/memory.max", "268435456");
  put(sys / "user.slice/app.scope/memory.max", "max");
  const CgroupLimit l = cgroup_memory_limit("0::/user.slice/app.scope\n", sys.string());
  EXPECT_EQ(l.bytes, 268435456u);
  EXPECT_EQ(l.file, (sys / "user.slice/memory.max").string());
  // A container's namespace: its own cgroup is the root, whose memory.max is the container's.
  const fs::path ns = test::scratch_dir("cgroup-ns");
  put(ns / "cgroup.controllers", "memory");
  put(ns / "memory.max", "67108864");
  EXPECT_EQ(cgroup_memory_limit("0::/\n", ns.string()).bytes, 67108864u);
}

TEST(CgroupLimit, HybridLayoutsReadV2UnderUnified) {
  const fs::path sys = test::scratch_dir("cgroup-hybrid");
  put(sys / "memory/memory.limit_in_bytes", kV1Unlimited);
  put(sys / "unified/svc/memory.max", "134217728");
  EXPECT_EQ(cgroup_memory_limit("4:memory:/\n0::/svc\n", sys.string()).bytes, 134217728u);
}

// This process's budget: never above its cgroup's limit less the margin, and it says where it
// came from.
TEST(HostBudget, StaysUnderTheLimitAndNamesItsSource) {
  const HostBudget b = default_host_budget();
  EXPECT_GT(b.bytes, 0u);
  EXPECT_FALSE(b.source.empty());
  if (b.limit.bytes) {
    EXPECT_LE(b.bytes, uint64_t(double(b.limit.bytes) * (1 - kCgroupMargin)));
  }
  EXPECT_TRUE(b.source.find("cgroup memory limit") != std::string::npos || b.source.find("MemAvailable") != std::string::npos)
      << b.source;
}

}  // namespace
}  // namespace ms
