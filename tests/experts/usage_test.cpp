// The usage history (experts/usage.h): round trip, merge with decay, the hottest experts, an
// atomic write that a kill cannot leave half-written, and every kind of bad file ignored with a
// warning naming it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "experts/usage.h"
#include "format/config.h"
#include "synth_support.h"
#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

EngineIndex tiny_index(uint64_t seed = 3) {
  const std::string dir = test::synth_tiny("usage-model-" + std::to_string(seed), seed);
  return read_engine_index(dir, load_config(dir));
}

UsageHistory some_usage(const EngineIndex& index) {
  UsageHistory h = empty_usage(index);
  for (size_t l = 0; l < h.counts.size(); ++l)
    for (size_t e = 0; e < h.counts[l].size(); ++e) h.counts[l][e] = double((e * 7 + l) % 5);
  h.runs = 1;
  return h;
}

TEST(Usage, RoundTripsThroughItsFile) {
  const EngineIndex index = tiny_index();
  const std::string path = test::scratch_dir("usage-rt") + "/usage.json";
  std::string warning;
  EXPECT_FALSE(read_usage(path, index, &warning).has_value());  // absent: nothing, and no warning
  EXPECT_EQ(warning, "");
  const UsageHistory h = some_usage(index);
  write_usage(path, h);
  const auto back = read_usage(path, index, &warning);
  ASSERT_TRUE(back.has_value()) << warning;
  EXPECT_EQ(back->counts, h.counts);
  EXPECT_EQ(back->runs, 1u);
  EXPECT_EQ(back->layers, h.layers);
  // No temporary file is left beside it.
  int files = 0;
  for ([[maybe_unused]] auto& f : fs::directory_iterator(fs::path(path).parent_path())) ++files;
  EXPECT_EQ(files, 1);
}

TEST(Usage, MergeDecaysTheOlderRuns) {
  const EngineIndex index = tiny_index();
  UsageHistory a = empty_usage(index), b = empty_usage(index);
  a.counts[0][3] = 8, a.runs = 1;
  b.counts[0][3] = 2, b.counts[0][5] = 1, b.runs = 1;
  a.merge(b, 0.5);
  EXPECT_DOUBLE_EQ(a.counts[0][3], 8 * 0.5 + 2);
  EXPECT_DOUBLE_EQ(a.counts[0][5], 1);
  EXPECT_EQ(a.runs, 2u);
  UsageHistory other = empty_usage(tiny_index(4));
  EXPECT_THROW(a.merge(other), Error);
}

TEST(Usage, HottestAreTheMostRoutedNeverRoutedLeftOut) {
  UsageHistory h = empty_usage(tiny_index());
  h.counts[1][4] = 3, h.counts[1][9] = 5, h.counts[1][2] = 3;
  EXPECT_EQ(h.hottest(1, 10), (std::vector<int>{9, 2, 4}));
  EXPECT_EQ(h.hottest(1, 2), (std::vector<int>{9, 2}));
  EXPECT_TRUE(h.hottest(0, 4).empty());
  EXPECT_FALSE(h.empty());
  EXPECT_TRUE(empty_usage(tiny_index()).empty());
}

// A writer killed at any moment leaves the old file or the new one, never a damaged one.
TEST(Usage, AWriterKilledMidWriteLeavesAWholeFile) {
  const EngineIndex index = tiny_index();
  const std::string path = test::scratch_dir("usage-kill") + "/usage.json";
  UsageHistory h = some_usage(index);
  write_usage(path, h);
  for (int round = 0; round < 20; ++round) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      UsageHistory mine = h;
      for (uint64_t i = 0;; ++i) {
        mine.runs = i;
        write_usage(path, mine);
      }
    }
    usleep(useconds_t(2000 + round * 700));
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    std::string warning;
    EXPECT_TRUE(read_usage(path, index, &warning).has_value()) << "round " << round << ": " << warning;
  }
}

TEST(Usage, BadFilesAreIgnoredWithAWarningNamingThem) {
  const EngineIndex index = tiny_index();
  const std::string dir = test::scratch_dir("usage-bad");
  const std::string good = dir + "/good.json";
  write_usage(good, some_usage(index));
  const std::string text = test::slurp(good);
  auto write = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir + "/" + name) << body;
    return dir + "/" + name;
  };
  struct Bad {
    std::string path, why;
  };
  std::string expert_count = text;  // one count fewer in the first layer
  const size_t first = expert_count.find("\"counts\":[") + 10;
  expert_count.erase(first, expert_count.find(',', first) + 1 - first);
  const std::vector<Bad> bad = {
      {write("truncated.json", text.substr(0, text.size() / 2)), "not valid JSON"},
      {write("empty.json", ""), "not valid JSON"},
      {write("other.json", R"({"format": "something else"})"), "not a usage history"},
      {write("version.json", R"({"format": "moestream-usage", "version": 9})"), "version 9"},
      {write("experts.json", expert_count), "experts"},
  };
  for (const Bad& b : bad) {
    std::string warning;
    EXPECT_FALSE(read_usage(b.path, index, &warning).has_value()) << b.path;
    EXPECT_NE(warning.find(b.path), std::string::npos) << warning;
    EXPECT_NE(warning.find(b.why), std::string::npos) << warning;
  }
  // Another model's history (other weights, same shape).
  std::string warning;
  EXPECT_FALSE(read_usage(good, tiny_index(4), &warning).has_value());
  EXPECT_NE(warning.find("another model"), std::string::npos) << warning;
}

// The history lives in the user's state directory under the model's id, whatever the model
// directory's permissions; a usage.json beside the model (older versions) is read until the
// state directory has one.
TEST(Usage, DefaultPathIsInTheStateDirectoryUnderTheModelsId) {
  const EngineIndex index = tiny_index();
  const std::string dir = test::scratch_dir("usage-where");
  const std::string saved = std::getenv("XDG_STATE_HOME") ? std::getenv("XDG_STATE_HOME") : "";
  setenv("XDG_STATE_HOME", (dir + "/state").c_str(), 1);
  const std::string p = default_usage_path(index);
  EXPECT_EQ(p, dir + "/state/moestream/" + fmt::format("{:016x}", usage_fingerprint(index)) + "/usage.json");
  EXPECT_NE(default_usage_path(tiny_index(4)), p);  // another model, another file
  UsageFiles f = usage_files(dir, index, "");
  EXPECT_EQ(f.read, p);
  EXPECT_EQ(f.write, p);
  EXPECT_TRUE(f.note.empty());
  std::ofstream(dir + "/usage.json") << "{}";
  f = usage_files(dir, index, "");
  EXPECT_EQ(f.read, dir + "/usage.json");
  EXPECT_EQ(f.write, p);
  EXPECT_NE(f.note.find("new history goes to " + p), std::string::npos) << f.note;
  write_usage(p, empty_usage(index));
  EXPECT_EQ(usage_files(dir, index, "").read, p);
  EXPECT_EQ(usage_files(dir, index, dir + "/mine.json").write, dir + "/mine.json");
  unsetenv("XDG_STATE_HOME");
  const char* home = std::getenv("HOME");
  if (home && *home) {
    EXPECT_EQ(state_dir(), std::string(home) + "/.local/state/moestream");
  }
  setenv("XDG_STATE_HOME", saved.c_str(), 1);
}

}  // namespace
}  // namespace ms
