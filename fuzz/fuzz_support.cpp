#include "fuzz_support.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace ms::fuzz {
namespace fs = std::filesystem;

namespace {

// /dev/shm keeps the per-input writes off the disk.
fs::path scratch_root() {
  if (const char* t = std::getenv("TMPDIR"); t && *t) return t;
  if (fs::is_directory("/dev/shm")) return "/dev/shm";
  return fs::temp_directory_path();
}

void remove_scratch() {
  std::error_code ec;
  fs::remove_all(scratch_dir(), ec);
}

}  // namespace

const std::string& scratch_dir() {
  // Never destroyed: remove_scratch runs at exit, after the destructors of later statics.
  static const std::string* dir = [] {
    fs::path d = scratch_root() / ("moestream-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    std::atexit(remove_scratch);
    return new std::string(d.string());
  }();
  return *dir;
}

std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  std::string path = (fs::path(scratch_dir()) / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

std::string source_path(const std::string& relative) { return (fs::path(MOESTREAM_SOURCE_DIR) / relative).string(); }

size_t json_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void refused(const std::exception& e) {
  static const bool print = std::getenv("MOESTREAM_FUZZ_PRINT") != nullptr;
  if (print) std::fprintf(stderr, "fuzz: refused: %s\n", e.what());
}

void accepted_invalid(std::string_view what) {
  std::fprintf(stderr, "fuzz: accepted invalid input: %.*s\n", int(what.size()), what.data());
  std::abort();
}

}  // namespace ms::fuzz
