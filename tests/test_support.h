#pragma once
// Test helpers: where ../shared is, scratch directories, running the built CLI.
#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "format/config.h"
#include "format/safetensors.h"
#include "util/error.h"

namespace ms::test {

using Vec = std::vector<float>;

// Seeded random inputs for kernel tests.
struct Rng {
  explicit Rng(unsigned seed) : gen(seed) {}
  float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.0f, sd)(gen); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  Vec normals(size_t n, float sd = 1.0f) {
    Vec v(n);
    for (auto& x : v) x = normal(sd);
    return v;
  }
  std::mt19937 gen;
};

// The values of an integer tensor (I64, I32 or I16) as ints.
std::vector<int> ints(const TensorView& t);
// Largest |a[i] - ref[i]| over a float32 reference tensor; a size mismatch fails the test.
float max_abs_diff(const std::vector<float>& a, const TensorView& ref);

// The fixtures' reference prompts (../shared/fixtures/<fixture>/reference.safetensors, "<prompt>.*"):
// the cases of the tests against transformers, on the CPU and on the GPU.
struct FixtureCase {
  const char* fixture;
  const char* prompt;
};
std::vector<FixtureCase> fixture_cases();
std::string fixture_case_name(const FixtureCase& c);  // a gtest parameter name: "qwen3_moe_tiny_p0"
// (layer, token) pairs whose routed expert set differs from the reference's "<prompt>.route.<layer>"
// (routes as ForwardResult has them); a reference of the wrong size fails the test.
int mismatched_route_sets(const std::vector<std::vector<int>>& routes, const TensorStore& ref, const std::string& prompt,
                          const ModelConfig& cfg);

// Runs fn, expecting an ms::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no ms::Error thrown; wanted one mentioning " << parts.front();
  } catch (const Error& e) {
    for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

// ../shared (or $MOESTREAM_SHARED); empty when absent.
std::string shared_dir();
// Path under shared_dir(), or GTEST_SKIP-worthy empty string when the shared data is absent.
std::string shared_path(const std::string& rel);
// The test data generators (tests/data), on Debian's python3 with numpy.
// An MLX-layout checkpoint of ../shared/fixtures/<fixture> (tests/data/mlx/make_checkpoint.py,
// `kind` default, mixed or f16) and the Hugging Face checkpoint of its dequantized weights; empty
// paths when ../shared is absent.
struct MlxPair {
  std::string mlx, ref;
};
MlxPair make_mlx(const std::string& fixture, const std::string& kind);
// Runs tests/data/gguf/make_gguf.py with `args` on gguf-py, extracted once per process from the
// llama.cpp archive in ../shared/peers; false (the test skips) when that is absent.
bool make_gguf(const std::string& args);

// A fresh empty directory under the build's temp area, removed at process exit.
std::string scratch_dir(const std::string& tag);
// Copies the engine directory `from` to `to` (which must not exist): only the files the model
// ships (engine_dir_files), never what runs or tools left beside it.
void copy_model(const std::string& from, const std::string& to);
// A copy of the embedded model (models/pycoder-moe-q4) in a fresh scratch directory.
std::string embedded_model_copy(const std::string& tag);
// Flips one byte in the middle of every record of expert layer `layer` (index order) of the
// engine directory `dir` (past the record header), as a bad disk or copy would; returns the blob's path.
std::string flip_expert_records(const std::string& dir, size_t layer);
// Flips one byte in the middle of tensor `name` of dir's dense.safetensors.
void flip_dense_tensor(const std::string& dir, const std::string& name);
// The state directory the processes of this test binary use ($XDG_STATE_HOME, set per process
// to a scratch directory so that no test reads or writes the user's).
std::string state_home();
// A file's bytes ("" when it cannot be read).
std::string slurp(const std::string& path);
// Drops every file under dir from the page cache, so that a child's reads of them are charged
// to its own cgroup rather than to this process, which wrote them.
void drop_cached(const std::string& dir);
// Runs the moestream binary with args; returns its exit status and fills stdout/stderr.
// Standard input is the file stdin_path (empty: /dev/null).
int run_cli(const std::string& args, std::string* out = nullptr, std::string* err = nullptr,
            const std::string& stdin_path = "");

// A memory cgroup of its own with a limit (cgroup v1, else v2), removed on destruction; path()
// is empty when none could be made (not root, a container without the controller), and the
// test should skip.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(size_t limit_bytes);
  ~MemoryCgroup();
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;
  const std::filesystem::path& path() const { return path_; }
  size_t read(const char* file) const;  // a number file: "memory.max_usage_in_bytes"
  size_t peak() const;                   // the most it held (page cache included): v1's or v2's file

 private:
  std::filesystem::path path_;
  bool v2_ = false;
};

// What a command run inside a cgroup left: its exit status (-1 when killed), its stderr and
// its own peak resident set (wait4's ru_maxrss).
struct CgroupRun {
  int rc = -1;
  std::string err;
  size_t peak_rss_bytes = 0;
};

// Runs the moestream binary with args as a child that joins `cg` before it execs; stdout goes
// to `out_path` (empty: /dev/null).
CgroupRun run_cli_in_cgroup(const MemoryCgroup& cg, const std::string& args, const std::string& out_path = "");

}  // namespace ms::test

// Skips the current test with a clear message when ../shared's reference data is missing.
#define MS_REQUIRE_SHARED(rel, var)                                                                  \
  std::string var = ::ms::test::shared_path(rel);                                                    \
  if (var.empty())                                                                                   \
  GTEST_SKIP() << "reference data " << (rel) << " not found: set MOESTREAM_SHARED to the shared/ " \
                  "folder (default ../shared beside the repository)"
