// The budget a container gives: `moestream generate` with no --memory, in a memory cgroup of its
// own (v1 here, v2 where the machine has it), reads the cgroup's limit and plans under it (less the 5 % margin): it
// completes with the tokens of an unconstrained run, the cgroup's peak stays within the limit,
// and --stats names the cgroup. Below the floor the run is refused, naming the limit; a
// --memory above the limit is refused with both numbers. Skips when no memory cgroup can be made.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "test_support.h"

namespace ms {
namespace {

const char* kModel = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
const std::string kGenerate = std::string("generate --model ") + kModel +
                              " --ids 563,279,1002,14,220,9,87,1500,33,4000,12,777,301,45,2020,7 --max-tokens 24 "
                              "--ignore-eos --stats";

struct Limited {
  test::CgroupRun run;
  std::string out;
  size_t peak = 0;
};

Limited generate_in(const test::MemoryCgroup& cg, const std::string& extra = "") {
  test::drop_cached(kModel);  // its reads are charged to the cgroup, not to whoever read it first
  Limited r;
  const std::string out_file = test::scratch_dir("budget-cgroup-out") + "/stdout";
  r.run = test::run_cli_in_cgroup(cg, kGenerate + extra, out_file);
  r.out = test::slurp(out_file);
  r.peak = cg.peak();
  return r;
}

TEST(DefaultBudget, GenerateStaysUnderTheCgroupLimitItWasNotTold) {
  if (test::MemoryCgroup(size_t(64) << 20).path().empty())
    GTEST_SKIP() << "cannot create a memory cgroup (needs root and the memory controller)";
  std::string want, err;
  ASSERT_EQ(test::run_cli(kGenerate, &want, &err), 0) << err;
  for (const size_t mib : {40, 64, 256}) {
    SCOPED_TRACE(std::to_string(mib) + " MiB");
    const size_t limit = mib << 20;
    test::MemoryCgroup cg(limit);
    const Limited r = generate_in(cg);
    std::printf("no --memory in a %zu MiB cgroup: exit %d, cgroup peak %.1f MiB (page cache included), peak RSS %.1f MiB\n",
                mib, r.run.rc, double(r.peak) / (1 << 20), double(r.run.peak_rss_bytes) / (1 << 20));
    ASSERT_EQ(r.run.rc, 0) << r.run.err;
    EXPECT_EQ(r.out, want);
    EXPECT_LE(r.peak, limit);
    EXPECT_NE(r.run.err.find("from the cgroup memory limit (" + std::to_string(mib) + ".0 MiB, " + cg.path().string()),
              std::string::npos)
        << r.run.err;
  }
}

TEST(DefaultBudget, BelowTheFloorTheRunIsRefusedNamingTheLimit) {
  test::MemoryCgroup cg(size_t(16) << 20);
  if (cg.path().empty()) GTEST_SKIP() << "cannot create a memory cgroup (needs root and the memory controller)";
  const Limited r = generate_in(cg);
  EXPECT_EQ(r.run.rc, 1) << "refused, not killed: " << r.run.err;
  EXPECT_NE(r.run.err.find("below the floor"), std::string::npos) << r.run.err;
  EXPECT_NE(r.run.err.find("with no --memory the budget is the cgroup memory limit (16.0 MiB, " + cg.path().string()),
            std::string::npos)
      << r.run.err;
}

TEST(DefaultBudget, AMemoryBudgetAboveTheCgroupLimitIsRefused) {
  test::MemoryCgroup cg(size_t(40) << 20);
  if (cg.path().empty()) GTEST_SKIP() << "cannot create a memory cgroup (needs root and the memory controller)";
  const Limited r = generate_in(cg, " --memory 1G");
  EXPECT_EQ(r.run.rc, 1) << r.run.err;
  EXPECT_NE(r.run.err.find("--memory 1.00 GiB is more than this process's cgroup memory limit of 40.0 MiB"),
            std::string::npos)
      << r.run.err;
  EXPECT_NE(r.run.err.find(cg.path().string()), std::string::npos) << r.run.err;
}

}  // namespace
}  // namespace ms
