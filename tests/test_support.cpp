#include "test_support.h"

#include <fcntl.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "format/engine_dir.h"


namespace ms::test {

namespace fs = std::filesystem;

// The moestream processes tests start keep no usage history (it would warm one test's pools
// from another's routings, and write into the repository's embedded model); the tests of the
// history name their files with --usage.
[[maybe_unused]] static const bool kNoUsageHistory = [] { return setenv("MOESTREAM_USAGE", "off", 0) == 0; }();

// Hermetic state: this process and the moestream processes it starts keep their state in a
// scratch directory of their own, never in the user's $XDG_STATE_HOME.
std::string state_home() {
  static const std::string dir = [] {
    std::string d = scratch_dir("state");
    setenv("XDG_STATE_HOME", d.c_str(), 1);
    return d;
  }();
  return dir;
}
[[maybe_unused]] static const std::string kStateHome = state_home();

std::vector<int> ints(const TensorView& t) {
  std::vector<int> v;
  for (int64_t i = 0; i < t.numel(); ++i)
    v.push_back(t.dtype == DType::I64 ? int(t.as<int64_t>()[i]) : t.dtype == DType::I32 ? t.as<int32_t>()[i] : t.as<int16_t>()[i]);
  return v;
}

float max_abs_diff(const std::vector<float>& a, const TensorView& ref) {
  EXPECT_EQ(int64_t(a.size()), ref.numel());
  float m = 0.f;
  for (size_t i = 0; i < a.size() && int64_t(i) < ref.numel(); ++i) m = std::max(m, std::abs(a[i] - ref.as<float>()[i]));
  return m;
}

std::vector<FixtureCase> fixture_cases() {
  std::vector<FixtureCase> cases;
  for (const char* fixture : {"qwen3-moe-tiny", "qwen3-next-tiny"})
    for (const char* prompt : {"p0", "p1", "p2"}) cases.push_back({fixture, prompt});
  return cases;
}

std::string fixture_case_name(const FixtureCase& c) {
  std::string n = std::string(c.fixture) + "_" + c.prompt;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

int mismatched_route_sets(const std::vector<std::vector<int>>& routes, const TensorStore& ref, const std::string& prompt,
                          const ModelConfig& cfg) {
  int mismatched = 0;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const TensorView& want = ref.get(prompt + ".route." + std::to_string(l));
    const std::vector<int>& got = routes[size_t(l)];
    if (want.numel() != int64_t(got.size())) {
      ADD_FAILURE() << prompt << ": layer " << l << " has " << got.size() << " routes, the reference " << want.numel();
      return -1;
    }
    for (size_t t = 0; t < got.size() / size_t(cfg.top_k); ++t) {
      const int* g = got.data() + t * size_t(cfg.top_k);
      const int32_t* e = want.as<int32_t>() + t * size_t(cfg.top_k);
      if (std::set<int>(g, g + cfg.top_k) != std::set<int>(e, e + cfg.top_k)) ++mismatched;
    }
  }
  return mismatched;
}

namespace {
// Environment variable `name` where set and not empty, else `fallback`.
std::string env_or(const char* name, const char* fallback) {
  const char* env = std::getenv(name);
  return env && *env ? env : fallback;
}
}  // namespace

std::string shared_dir() {
  const fs::path p(env_or("MOESTREAM_SHARED", MOESTREAM_SHARED_DEFAULT));
  return fs::is_directory(p) ? fs::canonical(p).string() : std::string();
}

std::string shared_path(const std::string& rel) {
  std::string root = shared_dir();
  if (root.empty()) return {};
  fs::path p = fs::path(root) / rel;
  return fs::exists(p) ? p.string() : std::string();
}

std::string scratch_dir(const std::string& tag) {
  // mkdtemp, not the pid alone: a test process killed before its atexit leaves its directory,
  // and a later process given the same pid found it full.
  // The name in a plain array: the atexit handler runs after static objects made before it
  // registered are destroyed, which a path built in the same initialiser would be.
  static char name[4096];
  static const fs::path root = [] {
    const std::string pattern = (fs::temp_directory_path() / "moestream-test-XXXXXX").string();
    if (pattern.size() >= sizeof name) throw std::runtime_error("temporary directory name too long: " + pattern);
    std::strcpy(name, pattern.c_str());
    if (!mkdtemp(name)) throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    std::atexit([] { std::error_code ec; fs::remove_all(fs::path(name), ec); });
    return fs::path(name);
  }();
  static int counter = 0;
  fs::path d = root / (tag + "-" + std::to_string(counter++));
  fs::create_directories(d);
  return d.string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void drop_cached(const std::string& dir) {
  for (auto& f : fs::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file()) continue;
    const int fd = ::open(f.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
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

void copy_model(const std::string& from, const std::string& to) {
  const ModelConfig cfg = load_config(from);
  const EngineIndex index = read_engine_index(from, cfg);
  for (const std::string& f : engine_dir_files(from, index)) {
    fs::create_directories((fs::path(to) / f).parent_path());
    fs::copy_file(fs::path(from) / f, fs::path(to) / f);
  }
}

std::string embedded_model_copy(const std::string& tag) {
  const std::string dir = scratch_dir(tag) + "/model";
  copy_model(MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4", dir);
  return dir;
}

static void flip_byte(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(at));
  const char c = char(f.get());
  f.seekp(std::streamoff(at));
  f.put(char(c ^ 0x5a));
  if (!f) throw std::runtime_error("cannot flip byte " + std::to_string(at) + " of " + path);
}

std::string flip_expert_records(const std::string& dir, size_t layer) {
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  const ExpertLayer& l = index.layers.at(layer);
  const std::string blob = (fs::path(dir) / l.file).string();
  const size_t middle = l.header_bytes + (l.record_bytes - l.header_bytes) / 2;
  for (int e = 0; e < l.n_experts; ++e) flip_byte(blob, size_t(e) * l.stride + middle);
  return blob;
}

void flip_dense_tensor(const std::string& dir, const std::string& name) {
  const std::string path = (fs::path(dir) / kEngineDenseFile).string();
  size_t at = 0;
  {
    const SafetensorsFile f(path);
    const TensorView& t = f.tensors().at(name);
    at = size_t(static_cast<const uint8_t*>(t.data) - f.file_data()) + t.nbytes / 2;
  }
  flip_byte(path, at);
}

static bool write_file(const fs::path& f, const std::string& v) {
  std::ofstream out(f);
  out << v;
  out.flush();
  return bool(out);
}

MemoryCgroup::MemoryCgroup(size_t limit_bytes) {
  static int counter = 0;
  const std::string name = "moestream-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  auto make = [&](const fs::path& root, const char* limit_file) {
    std::error_code ec;
    if (!fs::is_directory(root) || !fs::create_directory(root / name, ec)) return false;
    if (write_file(root / name / limit_file, std::to_string(limit_bytes))) return path_ = root / name, true;
    rmdir((root / name).c_str());
    return false;
  };
  if (make("/sys/fs/cgroup/memory", "memory.limit_in_bytes")) return;
  // cgroup v2: the memory controller enabled for the root's children, then a child of the root.
  const fs::path v2 = "/sys/fs/cgroup";
  if (slurp(v2 / "cgroup.controllers").find("memory") == std::string::npos) return;
  if (slurp(v2 / "cgroup.subtree_control").find("memory") == std::string::npos) write_file(v2 / "cgroup.subtree_control", "+memory");
  if (make(v2, "memory.max")) v2_ = true;
}

size_t MemoryCgroup::peak() const { return read(v2_ ? "memory.peak" : "memory.max_usage_in_bytes"); }

MemoryCgroup::~MemoryCgroup() {
  if (!path_.empty()) rmdir(path_.c_str());
}

size_t MemoryCgroup::read(const char* file) const {
  std::ifstream in(path_ / file);
  size_t v = 0;
  in >> v;
  return v;
}

CgroupRun run_cli_in_cgroup(const MemoryCgroup& cg, const std::string& args, const std::string& out_path) {
  const fs::path e = fs::path(scratch_dir("cgroup-run")) / "stderr";
  const std::string out = out_path.empty() ? std::string("/dev/null") : out_path;
  // The shell moves itself into the cgroup, then execs: the binary runs there from its start.
  const std::string script = "echo $$ > " + (cg.path() / "cgroup.procs").string() + " && exec " + MOESTREAM_BINARY +
                             " " + args + " </dev/null >" + out + " 2>" + e.string();
  CgroupRun r;
  const pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  rusage ru{};
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slurp(e);
  r.peak_rss_bytes = size_t(ru.ru_maxrss) * 1024;
  return r;
}

namespace {

void run_generator(const std::string& cmd) {
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("test data generator failed: " + cmd);
}

// The python3 that runs the generators, and where their scripts are: the build's, unless
// MOESTREAM_PYTHON / MOESTREAM_SOURCE_DIR say otherwise (test binaries run on another machine).
std::string generator(const std::string& script) {
  return env_or("MOESTREAM_PYTHON", MOESTREAM_PYTHON) + " " + env_or("MOESTREAM_SOURCE_DIR", MOESTREAM_SOURCE_DIR) +
         "/tests/data/" + script;
}

// gguf-py from the llama.cpp source archive, extracted once; "" without one.
std::string gguf_py() {
  static const std::string dir = [] {
    const std::string peers = shared_path("peers");
    if (peers.empty()) return std::string();
    std::string archive;
    for (auto& e : fs::directory_iterator(peers))
      if (e.path().filename().string().rfind("llama.cpp-", 0) == 0 && e.path().extension() == ".xz") archive = e.path();
    if (archive.empty()) return std::string();
    const std::string out = scratch_dir("gguf-py");
    run_generator("tar -xJf " + archive + " -C " + out + " gguf-py/gguf");
    return out + "/gguf-py";
  }();
  return dir;
}

}  // namespace

MlxPair make_mlx(const std::string& fixture, const std::string& kind) {
  const std::string src = shared_path("fixtures/" + fixture);
  if (src.empty()) return {};
  const std::string dir = scratch_dir("mlx-" + fixture + "-" + kind);
  MlxPair p{dir + "/mlx", dir + "/ref"};
  run_generator(generator("mlx/make_checkpoint.py") + " " + src + " " + p.mlx + " " + p.ref + " " + kind);
  return p;
}

bool make_gguf(const std::string& args) {
  const std::string py = gguf_py();
  if (py.empty()) return false;
  run_generator("PYTHONPATH=" + py + " " + generator("gguf/make_gguf.py") + " " + args);
  return true;
}

}  // namespace ms::test
