// Streaming in bounded memory: `moestream generate` on a synthetic model whose experts are
// several times a cgroup v1 memory limit completes inside that limit, with the same tokens as
// an unconstrained run, with prefetch (and its staging) on and off. Skips when no memory cgroup
// can be created.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
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

// The synthetic model (~480 MB, made once for every case here) and its unconstrained output.
struct Synthesized {
  std::string dir, gen, want;
  size_t expert_bytes = 0;
};
const Synthesized& synthesized() {
  static const Synthesized s = [] {
    Synthesized r;
    SynthOptions opt;
    opt.shape = streaming_shape();
    opt.out = test::scratch_dir("stream-cgroup") + "/model";
    synth_model(opt);
    r.dir = opt.out;
    for (auto& f : fs::directory_iterator(fs::path(opt.out) / "experts")) r.expert_bytes += f.file_size();
    r.gen = "generate --model " + opt.out + " --ids 11,12,13,14 --max-tokens 12 --ignore-eos";
    std::string err;
    if (test::run_cli(r.gen, &r.want, &err) != 0) r.want = "unconstrained run failed: " + err;
    return r;
  }();
  return s;
}

// `flags`: the streamed run's extra flags ("" = the defaults: prefetch auto, on as the pools
// stream). *stats: what --stats printed.
void generate_under_the_limit(const std::string& flags, std::string* stats = nullptr) {
  test::MemoryCgroup cg(kLimit);
  if (cg.path().empty()) GTEST_SKIP() << "cannot create a memory cgroup under /sys/fs/cgroup/memory (needs cgroup v1 and root)";
  const Synthesized& m = synthesized();
  ASSERT_GE(m.expert_bytes, 3 * kLimit);
  ASSERT_EQ(m.want.find("unconstrained run failed"), std::string::npos) << m.want;

  drop_cached(m.dir);
  const std::string out_file = test::scratch_dir("stream-cgroup-out") + "/stdout";
  const test::CgroupRun run =
      test::run_cli_in_cgroup(cg, m.gen + " --memory " + std::to_string(kLimit) + " --stats " + flags, out_file);
  const size_t peak = cg.read("memory.max_usage_in_bytes");
  std::printf("[%s] generated from %.0f MB of experts under a %.0f MB cgroup limit: exit %d, cgroup peak %.1f MB (page "
              "cache included), peak RSS %.1f MB\n%s",
              flags.c_str(), double(m.expert_bytes) / 1e6, double(kLimit) / 1e6, run.rc, double(peak) / 1e6,
              double(run.peak_rss_bytes) / 1e6, run.err.c_str());
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_LE(peak, kLimit);
  EXPECT_LT(run.peak_rss_bytes, kLimit);
  EXPECT_EQ(slurp(out_file), m.want);
  EXPECT_NE(run.err.find("evictions"), std::string::npos);
  if (stats) *stats = run.err;
}

// The number after `key` in --stats' output, or -1.
long number_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::strtol(text.c_str() + at + key.size(), nullptr, 10);
}

// One test, one synthesized model (ctest runs each test in a process of its own): the defaults
// (prefetch auto: on, as the pools stream), then prefetch on and off explicitly. With prefetch on
// its staging is in the memory plan (--stats says how much) and its reads land there; the cap,
// the peak and the tokens are as without it.
TEST(StreamingMemory, ExpertsSeveralTimesTheCgroupLimitGenerateUnderIt) {
  {
    SCOPED_TRACE("defaults");
    generate_under_the_limit("");
  }
  if (HasFatalFailure() || IsSkipped()) return;
  {
    SCOPED_TRACE("--prefetch on");
    std::string stats;
    generate_under_the_limit("--prefetch on", &stats);
    EXPECT_EQ(stats.find("prefetch staging 0.0 MiB"), std::string::npos) << "staging is planned: " << stats;
    EXPECT_NE(stats.find("prefetch staging"), std::string::npos) << stats;
    EXPECT_NE(stats.find("prefetch: width"), std::string::npos) << stats;
    EXPECT_GT(number_after(stats, ", read ahead "), 0) << stats;
    EXPECT_GT(number_after(stats, ", used "), 0) << stats;
  }
  {
    SCOPED_TRACE("--prefetch off");
    std::string stats;
    generate_under_the_limit("--prefetch off", &stats);
    EXPECT_NE(stats.find("prefetch staging 0.0 MiB"), std::string::npos) << "no staging planned: " << stats;
    EXPECT_EQ(stats.find("prefetch: width"), std::string::npos) << stats;
  }
}

}  // namespace
}  // namespace ms
