// --memory holds during prefill: `moestream generate` with prompts of thousands of tokens under a
// memory budget, in a cgroup v1 memory cgroup of its own, peaks within the budget (the cgroup's
// memory.max_usage_in_bytes) and gives the tokens an unconstrained run gives. The prompt runs in
// chunks whose activations the memory plan counts. Skips when no memory cgroup can be created.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::drop_cached;
using test::slurp;

const char* kModel = MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4";
constexpr size_t kCgroupLimit = size_t(64) << 20;  // the machine the prompt was OOM-killed on

std::string random_ids(int n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> id(1, 8191);  // the model's vocabulary, but for <|endoftext|>
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ',';
    s += std::to_string(id(gen));  // (not "," + ...: GCC 12 warns, wrongly, of an overlapping copy)
  }
  return s;
}

struct Case {
  int prompt_tokens;
  const char* memory;  // --memory
  size_t budget;       // the same in bytes
  int context;         // --context
};

void expect_prefill_within_budget(const Case& c) {
  const std::string gen = fmt::format("generate --model {} --ids {} --max-tokens 4 --ignore-eos --context {}", kModel,
                                      random_ids(c.prompt_tokens, unsigned(c.prompt_tokens)), c.context);
  std::string want, err;
  ASSERT_EQ(0, test::run_cli(gen, &want, &err)) << err;

  test::MemoryCgroup cg(kCgroupLimit);
  ASSERT_FALSE(cg.path().empty());
  drop_cached(kModel);
  const std::string out_file = test::scratch_dir("prefill-cgroup-out") + "/stdout";
  const test::CgroupRun run = test::run_cli_in_cgroup(cg, gen + " --memory " + c.memory + " --stats", out_file);
  const size_t peak = cg.read("memory.max_usage_in_bytes");
  std::printf("%d-token prompt under --memory %s: exit %d, cgroup peak %.1f MiB (page cache included), peak RSS %.1f "
              "MiB\n",
              c.prompt_tokens, c.memory, run.rc, double(peak) / (1 << 20), double(run.peak_rss_bytes) / (1 << 20));
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_LE(peak, c.budget) << run.err;
  EXPECT_EQ(slurp(out_file), want);
}

TEST(PrefillMemory, LongPromptsPeakWithinTheMemoryBudget) {
  if (test::MemoryCgroup(kCgroupLimit).path().empty())
    GTEST_SKIP() << "cannot create a memory cgroup under /sys/fs/cgroup/memory (needs cgroup v1 and root)";
  // The case (127 MB before prompts ran in chunks), and a tighter budget on a shorter
  // context.
  expect_prefill_within_budget({4000, "50M", size_t(50) << 20, 4096});
  expect_prefill_within_budget({1500, "40M", size_t(40) << 20, 2048});
}

}  // namespace
}  // namespace ms
