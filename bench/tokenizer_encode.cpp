// Encode throughput of the tokenizer in MB/s on a large body of source text.
//
//   bench_tokenizer_encode [--tokenizer FILE] [--runs N] [--max-mb M] [PATH...]
//
// PATHs are files or directories (walked recursively; files that are not valid UTF-8 are
// skipped), concatenated up to --max-mb. Without PATHs: this repository's src/ and tests/,
// repeated up to --max-mb. The first run starts with an empty word cache ("cold"); the
// median is over the runs after it. Both wall-clock and CPU-time rates are printed: on a
// machine shared with other work the CPU-time rate is the steadier one (encode is one thread).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace {

struct Args {
  std::string tokenizer = MOESTREAM_SOURCE_DIR "/../shared/tokenizers/qwen3/tokenizer.json";
  int runs = 5;
  size_t max_bytes = size_t(32) << 20;
  std::vector<std::string> paths;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) ms::fail("{} needs a value", s);
      return argv[++i];
    };
    if (s == "--tokenizer") a.tokenizer = value();
    else if (s == "--runs") a.runs = std::max(1, std::stoi(value()));
    else if (s == "--max-mb") a.max_bytes = size_t(std::stod(value()) * (1 << 20));
    else a.paths.push_back(s);
  }
  return a;
}

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void append_path(const fs::path& p, size_t max_bytes, std::string& corpus) {
  std::vector<fs::path> files;
  if (fs::is_directory(p)) {
    for (const auto& e : fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(p);
  }
  for (const auto& f : files) {
    if (corpus.size() >= max_bytes) return;
    std::string text = slurp(f);
    if (ms::utf8::first_invalid(text) == std::string::npos) corpus += text;
  }
}

std::string build_corpus(const Args& a) {
  std::string corpus;
  if (!a.paths.empty()) {
    for (const auto& p : a.paths) append_path(p, a.max_bytes, corpus);
  } else {
    std::string repo;
    for (const char* dir : {"src", "tests"}) append_path(fs::path(MOESTREAM_SOURCE_DIR) / dir, a.max_bytes, repo);
    while (!repo.empty() && corpus.size() < a.max_bytes) corpus += repo;
  }
  if (corpus.size() > a.max_bytes) {
    size_t cut = a.max_bytes;
    while (cut > 0 && (static_cast<unsigned char>(corpus[cut]) & 0xC0) == 0x80) --cut;  // whole characters
    corpus.resize(cut);
  }
  return corpus;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a = parse_args(argc, argv);
  std::string corpus = build_corpus(a);
  if (corpus.empty()) ms::fail("no input text found");

  auto t0 = std::chrono::steady_clock::now();
  ms::Tokenizer tok = ms::Tokenizer::load(a.tokenizer);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  double mb = double(corpus.size()) / 1e6;
  size_t n_tokens = 0;
  std::vector<double> wall, cpu;  // MB/s of each run; run 0 is the cold one
  for (int r = 0; r <= a.runs; ++r) {
    auto w0 = std::chrono::steady_clock::now();
    double c0 = thread_cpu_seconds();
    n_tokens = tok.encode(corpus).size();
    cpu.push_back(mb / (thread_cpu_seconds() - c0));
    wall.push_back(mb / std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
  }
  std::vector<double> warm_wall(wall.begin() + 1, wall.end()), warm_cpu(cpu.begin() + 1, cpu.end());
  std::printf("tokenizer  %s (loaded in %.2f s)\n", a.tokenizer.c_str(), load_s);
  std::printf("input      %.2f MB, %zu tokens (%.2f bytes/token)\n", mb, n_tokens,
              double(corpus.size()) / double(n_tokens));
  std::printf("encode     wall: cold %.1f MB/s, warm median %.1f MB/s (min %.1f, max %.1f) over %d runs\n",
              wall[0], median(warm_wall), *std::min_element(warm_wall.begin(), warm_wall.end()),
              *std::max_element(warm_wall.begin(), warm_wall.end()), a.runs);
  std::printf("           cpu:  cold %.1f MB/s, warm median %.1f MB/s\n", cpu[0], median(warm_cpu));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_tokenizer_encode: %s\n", e.what());
  return 1;
}
