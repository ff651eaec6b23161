#include "test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ms::test {

namespace fs = std::filesystem;

std::string shared_dir() {
  const char* env = std::getenv("MOESTREAM_SHARED");
  fs::path p = env && *env ? fs::path(env) : fs::path(MOESTREAM_SHARED_DEFAULT);
  return fs::is_directory(p) ? fs::canonical(p).string() : std::string();
}

std::string shared_path(const std::string& rel) {
  std::string root = shared_dir();
  if (root.empty()) return {};
  fs::path p = fs::path(root) / rel;
  return fs::exists(p) ? p.string() : std::string();
}

std::string scratch_dir(const std::string& tag) {
  static fs::path root = [] {
    fs::path r = fs::temp_directory_path() / ("moestream-test-" + std::to_string(getpid()));
    fs::create_directories(r);
    std::atexit([] { std::error_code ec; fs::remove_all(fs::temp_directory_path() / ("moestream-test-" + std::to_string(getpid())), ec); });
    return r;
  }();
  static int counter = 0;
  fs::path d = root / (tag + "-" + std::to_string(counter++));
  fs::create_directories(d);
  return d.string();
}

static std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_cli(const std::string& args, std::string* out, std::string* err, const std::string& stdin_path) {
  std::string dir = scratch_dir("cli");
  fs::path o = fs::path(dir) / "stdout", e = fs::path(dir) / "stderr";
  std::string in = stdin_path.empty() ? std::string("/dev/null") : stdin_path;
  std::string cmd = std::string(MOESTREAM_BINARY) + " " + args + " <" + in + " >" + o.string() + " 2>" + e.string();
  int status = std::system(cmd.c_str());
  if (out) *out = slurp(o);
  if (err) *err = slurp(e);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace ms::test
