// Streaming in bounded memory: `moestream generate` on a synthetic model whose experts are
// several times a cgroup v1 memory limit completes inside that limit, with the same tokens as
// an unconstrained run. Skips when no memory cgroup can be created.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "writers/synth.h"
#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::drop_cached;
using test::slurp;

constexpr size_t kLimit = size_t(128) << 20;

// Experts of ~0.9 MB (4-bit, 512 x 1024), 128 a layer, 4 layers (the last full attention):
// ~460 MB of experts beside ~20 MB of dense weights.
SynthShape streaming_shape() {
  SynthShape s = synth_shape("tiny");
  s.hidden = 1024, s.vocab = 4096, s.layers = 4;
  s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 128;
  s.lin_k_heads = 4, s.lin_v_heads = 8, s.lin_k_dim = 64, s.lin_v_dim = 64;
  s.n_experts = 128, s.top_k = 8, s.moe_inter = 512, s.shared_inter = 512;
  return s;
}

TEST(StreamingMemory, ExpertsSeveralTimesTheCgroupLimitGenerateUnderIt) {
  test::MemoryCgroup cg(kLimit);
  if (cg.path().empty()) GTEST_SKIP() << "cannot create a memory cgroup under /sys/fs/cgroup/memory (needs cgroup v1 and root)";
  SynthOptions opt;
  opt.shape = streaming_shape();
  opt.out = test::scratch_dir("stream-cgroup") + "/model";
  synth_model(opt);
  size_t expert_bytes = 0;
  for (auto& f : fs::directory_iterator(fs::path(opt.out) / "experts")) expert_bytes += f.file_size();
  ASSERT_GE(expert_bytes, 3 * kLimit);

  const std::string gen = "generate --model " + opt.out + " --ids 11,12,13,14 --max-tokens 12 --ignore-eos";
  std::string want, err;
  ASSERT_EQ(0, test::run_cli(gen, &want, &err)) << err;

  drop_cached(opt.out);
  const std::string out_file = test::scratch_dir("stream-cgroup-out") + "/stdout";
  const test::CgroupRun run = test::run_cli_in_cgroup(cg, gen + " --memory " + std::to_string(kLimit) + " --stats", out_file);
  const size_t peak = cg.read("memory.max_usage_in_bytes");
  std::printf("generated from %.0f MB of experts under a %.0f MB cgroup limit: exit %d, cgroup peak %.1f MB (page cache "
              "included), peak RSS %.1f MB\n%s",
              double(expert_bytes) / 1e6, double(kLimit) / 1e6, run.rc, double(peak) / 1e6, double(run.peak_rss_bytes) / 1e6,
              run.err.c_str());
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_LE(peak, kLimit);
  EXPECT_LT(run.peak_rss_bytes, kLimit);
  EXPECT_EQ(slurp(out_file), want);
  EXPECT_NE(run.err.find("evictions"), std::string::npos);
}

}  // namespace
}  // namespace ms
