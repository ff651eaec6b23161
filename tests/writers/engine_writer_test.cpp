// Engine directories are written under OUT.tmp-XXXXXX and renamed when complete; a writer killed
// outright (SIGKILL) leaves its temporary directory, which the next convert or synth to OUT
// removes, while a live writer's (its lock held) is left alone. Real processes, real files.
#include "writers/engine_writer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

// The OUT.tmp-* directories beside out.
std::vector<fs::path> temp_dirs(const fs::path& out) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(out.parent_path()))
    if (e.path().filename().string().rfind(out.filename().string() + ".tmp-", 0) == 0) found.push_back(e.path());
  return found;
}

// `moestream convert` of pycoder-moe to out, SIGKILLed once its temporary directory (one that
// was not there before) has the experts folder: mid-way through writing.
void convert_and_kill(const std::string& from, const fs::path& out) {
  const std::vector<fs::path> before = temp_dirs(out);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(MOESTREAM_BINARY, MOESTREAM_BINARY, "convert", "--from", from.c_str(), "--out", out.c_str(), "--expert-bits", "4",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool midway = false;
  while (!midway && std::chrono::steady_clock::now() < give_up) {
    for (const fs::path& t : temp_dirs(out))
      midway = midway || (std::find(before.begin(), before.end(), t) == before.end() && fs::exists(t / "experts"));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(midway) << "the convert never reached its experts";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the convert finished before it was killed";
}

TEST(EngineWriter, KilledConvertsTempDirIsRemovedByTheNextConvert) {
  MS_REQUIRE_SHARED("models/pycoder-moe", from);
  const fs::path out = fs::path(test::scratch_dir("writer-killed")) / "m";
  convert_and_kill(from, out);
  const std::vector<fs::path> first = temp_dirs(out);
  ASSERT_EQ(first.size(), 1u);  // what the killed writer left
  // A second writer, killed too, removed the first's and left its own.
  convert_and_kill(from, out);
  const std::vector<fs::path> second = temp_dirs(out);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_NE(second[0], first[0]);
  EXPECT_FALSE(fs::exists(out));
  std::string err;
  ASSERT_EQ(test::run_cli("convert --from " + from + " --out " + out.string() + " --expert-bits 4", nullptr, &err), 0) << err;
  EXPECT_TRUE(temp_dirs(out).empty());
  EXPECT_FALSE(fs::exists(out / TempDir::kWriterLock));
  std::string text;
  EXPECT_EQ(test::run_cli("generate --model " + out.string() + " --ids 1,2,3 --max-tokens 2 --verify", &text, &err), 0) << err;
}

TEST(EngineWriter, LiveWritersTempDirIsLeftAlone) {
  const fs::path out = fs::path(test::scratch_dir("writer-live")) / "m";
  const TempDir live(out);  // held by this process, as a running convert holds its own
  std::ofstream(live.path() / "dense.safetensors") << "partial";
  const fs::path dead = out.string() + ".tmp-dead01";  // a writer's that died before it took its lock
  fs::create_directory(dead);
  std::ofstream(dead / "dense.safetensors") << "partial";
  const fs::path unrelated[] = {out.string() + ".tmp-longer1", out.string() + "x.tmp-abcdef", out.string() + ".tmp-file01"};
  fs::create_directory(unrelated[0]);
  fs::create_directory(unrelated[1]);
  std::ofstream(unrelated[2]) << "a file, not a directory";

  std::string err;
  ASSERT_EQ(test::run_cli("synth --like tiny --layers 2 --out " + out.string(), nullptr, &err), 0) << err;
  EXPECT_TRUE(fs::exists(live.path() / "dense.safetensors"));
  EXPECT_FALSE(fs::exists(dead));
  for (const fs::path& u : unrelated) EXPECT_TRUE(fs::exists(u)) << u;
  EXPECT_TRUE(fs::exists(out / "moestream.json"));
  EXPECT_FALSE(fs::exists(out / TempDir::kWriterLock));
}

TEST(EngineWriter, RemoveDeadTempDirsCountsWhatItRemoved) {
  const fs::path out = fs::path(test::scratch_dir("writer-count")) / "m";
  for (const char* name : {".tmp-aaaaaa", ".tmp-bbbbbb", ".tmp-cccccc"}) fs::create_directories(out.string() + name + "/experts");
  const TempDir live(out);  // sweeps the three dead ones first
  EXPECT_EQ(temp_dirs(out), std::vector<fs::path>{live.path()});
  EXPECT_EQ(remove_dead_temp_dirs(out), 0);
  EXPECT_TRUE(fs::exists(live.path()));
}

}  // namespace
}  // namespace ms
